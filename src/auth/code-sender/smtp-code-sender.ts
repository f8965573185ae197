import { BlockList, isIP } from 'node:net';
import type { Transporter } from 'nodemailer';
import { minutesLeft, RecipientRefusedError, type CodeMessage, type CodeSender } from './code-sender.js';

const PURPOSES: Record<CodeMessage['scene'], string> = {
  REGISTER: 'sign-up',
  LOGIN: 'sign-in',
  RESET_PASSWORD: 'password reset',
};

const SUBJECTS: Record<CodeMessage['scene'], string> = {
  REGISTER: '知光 · 注册验证码 / Zhiguang sign-up code',
  LOGIN: '知光 · 登录验证码 / Zhiguang sign-in code',
  RESET_PASSWORD: '知光 · 重置密码验证码 / Zhiguang password reset code',
};

/** Mails codes through an SMTP server; nodemailer is loaded only when this sender is built. */
export class SmtpCodeSender implements CodeSender {
  private constructor(
    private readonly transport: Transporter,
    private readonly from: string,
  ) {}

  static async create(url: string, from: string): Promise<SmtpCodeSender> {
    const nodemailer = await import('nodemailer');
    const parsed = new URL(url);
    const transport = nodemailer.createTransport({
      host: parsed.hostname,
      port: Number(parsed.port || (parsed.protocol === 'smtps:' ? 465 : 587)),
      secure: parsed.protocol === 'smtps:',
      // On smtp: nodemailer takes STARTTLS only when the server offers it, and otherwise signs in
      // and sends in plaintext: a server whose offer someone between strips would give away its
      // password and every code. Required, except to this machine or with `?tls=optional`.
      requireTLS: parsed.protocol === 'smtp:' && !tlsOptional(parsed) && !isLoopback(parsed.hostname),
      ...(parsed.username
        ? { auth: { user: decodeURIComponent(parsed.username), pass: decodeURIComponent(parsed.password) } }
        : {}),
      connectionTimeout: 10_000,
      greetingTimeout: 10_000,
      socketTimeout: 20_000,
    });
    return new SmtpCodeSender(transport, from);
  }

  async send(message: CodeMessage): Promise<void> {
    const minutes = minutesLeft(message.expireSeconds);
    await this.transport
      .sendMail({
        from: this.from,
        // An address as it is, never parsed for display names or lists.
        to: { name: '', address: message.identifier },
        subject: SUBJECTS[message.scene],
        text:
          `您的验证码是 ${message.code}，${minutes} 分钟内有效。\n` +
          `Your Zhiguang ${PURPOSES[message.scene]} verification code is ${message.code}. It expires in ${minutes} minute${minutes === 1 ? '' : 's'}.\n` +
          `If you did not ask for it, ignore this mail.`,
      })
      .catch((err: unknown) => {
        if (refusesRecipient(err))
          throw new RecipientRefusedError('the mail server refused the recipient', { cause: err });
        throw err;
      });
  }

  async close(): Promise<void> {
    this.transport.close();
  }
}

/**
 * Whether the mail server refused this recipient (any answer to RCPT TO that is not a 2xx), rather
 * than failing as a whole (connecting, signing in, MAIL FROM, DATA). Such an answer may still be
 * the server's trouble (a relay not allowed refuses every recipient alike): the verification service
 * only leaves it out of its outage reckoning for sign-up codes, whose address anyone may choose.
 */
export function refusesRecipient(err: unknown): boolean {
  const e = err as { code?: unknown; command?: unknown } | null;
  return e?.code === 'EENVELOPE' && e.command === 'RCPT TO';
}

/** `ZG_SMTP_URL`'s `?tls=optional`: plaintext allowed where the server offers no STARTTLS. */
export function tlsOptional(url: URL): boolean {
  return url.searchParams.get('tls') === 'optional';
}

/** A host name of this machine itself, whose traffic no one between can read. */
export function isLoopback(hostname: string): boolean {
  // smtp: is not a special scheme to URL: the host comes as written (any case, a final dot).
  const host = (hostname.startsWith('[') ? hostname.slice(1, -1) : hostname).toLowerCase().replace(/\.$/, '');
  if (host === 'localhost') return true;
  if (isIP(host) === 4) return LOOPBACK.check(host, 'ipv4');
  return isIP(host) === 6 && LOOPBACK.check(host, 'ipv6');
}

const LOOPBACK = new BlockList();
LOOPBACK.addSubnet('127.0.0.0', 8, 'ipv4');
LOOPBACK.addAddress('::1', 'ipv6');
// 127/8 written as IPv6 (::ffff:127.0.0.1).
LOOPBACK.addSubnet('::ffff:127.0.0.0', 104, 'ipv6');
