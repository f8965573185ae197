/**
 * A process of its own holding one Kafka subscription, for tests that kill it: subscribes group `g`
 * of the log with the given prefix to topic `t` and prints `subscribed`, then `handled <value>` for
 * every record it is handed.
 *
 * Usage: node --import tsx test/rig/kafka-member.ts <brokers> <prefix> <memberName>
 */
import { KafkaEventLog } from '../../src/platform/eventlog/kafka-eventlog.js';

const [brokers, prefix, memberName] = process.argv.slice(2);
const log = new KafkaEventLog({
  brokers: brokers!.split(','),
  prefix: prefix!,
  partitions: 3,
  clientId: 'zg-member',
  memberName: memberName!,
});
await log.subscribe({
  group: 'g',
  topics: ['t'],
  maxBatch: 10,
  maxWaitMs: 10,
  handler: async (batch) => {
    for (const r of batch.records) process.stdout.write(`handled ${r.value}\n`);
  },
  onError: (err) => process.stderr.write(`${String(err)}\n`),
});
process.stdout.write('subscribed\n');
