import { Redis } from 'ioredis';
import { services, uniqueName } from '../../../test/rig/resources.js';
import { createLocalInvalidationBus, createRedisInvalidationBus } from './create.js';
import { defineInvalidationBusContract } from './invalidation-bus.contract.js';
import { LocalInvalidationHub } from './local-invalidation-bus.js';

defineInvalidationBusContract('in process', async () => {
  const hub = new LocalInvalidationHub();
  const a = createLocalInvalidationBus(hub);
  const b = createLocalInvalidationBus(hub);
  const other = createLocalInvalidationBus();
  return {
    a,
    b,
    other,
    cleanup: async () => {
      for (const bus of [a, b, other]) await bus.close();
    },
  };
});

defineInvalidationBusContract('redis pub/sub', async () => {
  const publisher = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
  const prefix = `${uniqueName('bus')}:`;
  const start = (p: string) =>
    createRedisInvalidationBus({
      publisher,
      subscriber: new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 }),
      prefix: p,
    });
  const subscriberOfB = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
  const idOfB = await subscriberOfB.client('ID');
  const [a, b, other] = await Promise.all([
    start(prefix),
    createRedisInvalidationBus({ publisher, subscriber: subscriberOfB, prefix }),
    start(`${uniqueName('bus')}:`),
  ]);
  return {
    a,
    b,
    other,
    interruptB: async () => {
      await publisher.client('KILL', 'ID', String(idOfB));
    },
    cleanup: async () => {
      for (const bus of [a, b, other]) await bus.close();
      await publisher.quit();
    },
  };
});
