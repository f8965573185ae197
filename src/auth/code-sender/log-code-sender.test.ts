import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { LogCodeSender } from './log-code-sender.js';

describe(LogCodeSender.name, () => {
  it('writes the code as one line, also when the log level is above info', async () => {
    for (const level of ['info', 'warn', 'error', 'silent']) {
      const lines: Record<string, unknown>[] = [];
      const log = pino({ level }, { write: (line: string) => void lines.push(JSON.parse(line)) });
      log.info('other lines keep the level');
      await new LogCodeSender(log).send({
        identifier: 'me@example.com',
        identifierType: 'EMAIL',
        scene: 'REGISTER',
        code: '123456',
        expireSeconds: 300,
      });
      expect({ level, lines: lines.filter((l) => l.msg !== 'other lines keep the level') }).toEqual({
        level,
        lines: [
          expect.objectContaining({
            msg: 'verification code',
            identifier: 'me@example.com',
            identifierType: 'EMAIL',
            scene: 'REGISTER',
            code: '123456',
          }),
        ],
      });
      expect(lines).toHaveLength(level === 'info' ? 2 : 1);
    }
  });
});
