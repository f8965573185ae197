import { describe, expect, it } from 'vitest';
import { minutesLeft } from './code-sender.js';
import { refusesRecipient } from './smtp-code-sender.js';

/** An error as nodemailer's SMTP connection formats one (`_formatError`). */
function smtpError(command: string, response: string, code = 'EENVELOPE') {
  const responseCode = Number(/^\d+/.exec(response)?.[0]);
  return Object.assign(new Error(`failed: ${response}`), { code, command, response, responseCode });
}

describe(refusesRecipient.name, () => {
  it('tells a refused recipient from a mail server failing as a whole', () => {
    expect(refusesRecipient(smtpError('RCPT TO', '550 5.1.1 <nobody@b.cd>: user unknown'))).toBe(true);
    expect(refusesRecipient(smtpError('RCPT TO', '450 4.2.0 greylisted, try again later'))).toBe(true);
    expect(refusesRecipient(smtpError('RCPT TO', '554 5.7.1 relay access denied'))).toBe(true);
    // The sender, the message or the connection: the channel's trouble whoever the recipient is.
    expect(refusesRecipient(smtpError('MAIL FROM', '550 5.7.0 sender not allowed'))).toBe(false);
    expect(refusesRecipient(smtpError('MAIL FROM', '530 5.7.0 authentication required'))).toBe(false);
    expect(refusesRecipient(smtpError('DATA', '554 transaction failed'))).toBe(false);
    expect(refusesRecipient(Object.assign(new Error('connect ECONNREFUSED'), { code: 'ESOCKET' }))).toBe(
      false,
    );
    expect(refusesRecipient(null)).toBe(false);
  });
});

describe(minutesLeft.name, () => {
  it('says the whole minutes a code has left, never more', () => {
    expect([300, 299, 120, 119, 90, 60, 59].map(minutesLeft)).toEqual([5, 4, 2, 1, 1, 1, 1]);
  });
});
