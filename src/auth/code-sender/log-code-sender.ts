import type { Logger } from 'pino';
import type { CodeMessage, CodeSender } from './code-sender.js';

/**
 * Writes the code to the log as one structured line with `identifier`, `scene` and `code`, so a
 * person running the service locally can sign up without a mail server or SMS gateway.
 */
export class LogCodeSender implements CodeSender {
  private readonly log: Logger;

  /** The line is written whatever `LOG_LEVEL` says: with the codes kept from the log, nobody signs up. */
  constructor(log: Logger) {
    this.log = log.isLevelEnabled('info') ? log : log.child({}, { level: 'info' });
  }

  async send(message: CodeMessage): Promise<void> {
    this.log.info(
      {
        identifier: message.identifier,
        identifierType: message.identifierType,
        scene: message.scene,
        code: message.code,
      },
      'verification code',
    );
  }
}
