import pino, { type Logger } from 'pino';

/** Structured JSON logs; pretty-printed only when a person is watching a terminal. */
export function createLogger(level: string, destination?: pino.DestinationStream): Logger {
  const pretty = process.stdout.isTTY && destination === undefined;
  const options: pino.LoggerOptions = {
    level,
    base: { service: 'zhiguang' },
    redact: { paths: ['req.headers.authorization', 'password', 'newPassword', 'refreshToken'], remove: true },
    ...(pretty ? { transport: { target: 'pino-pretty', options: { translateTime: 'SYS:HH:MM:ss.l' } } } : {}),
  };
  return destination ? pino(options, destination) : pino(options);
}
