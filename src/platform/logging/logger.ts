import pino, { type Logger } from 'pino';

/**
 * Structured JSON logs; pretty-printed only when a person is watching a terminal and `pino-pretty`
 * is installed (it is a development dependency: a production install without it logs JSON).
 */
export function createLogger(level: string, destination?: pino.DestinationStream): Logger {
  const pretty = process.stdout.isTTY && destination === undefined && installed('pino-pretty');
  const options: pino.LoggerOptions = {
    level,
    base: { service: 'zhiguang' },
    redact: { paths: ['req.headers.authorization', 'password', 'newPassword', 'refreshToken'], remove: true },
    serializers: { err: serializeError },
    ...(pretty ? { transport: { target: 'pino-pretty', options: { translateTime: 'SYS:HH:MM:ss.l' } } } : {}),
  };
  return destination ? pino(options, destination) : pino(options);
}

function installed(name: string): boolean {
  try {
    import.meta.resolve(name);
    return true;
  } catch {
    return false;
  }
}

/**
 * pino's error serializer, without what a client library attached of the command that failed: a
 * Redis error carries the command's arguments (`command.args`), which can be a verification code,
 * an e-mail address or a session key; a MySQL error the statement with its values written in
 * (`sql`: a password hash, a phone number); a refused mail its recipients. Mailboxes of e-mail
 * addresses in messages are left out. The command's name and the error's codes stay; so do causes,
 * cleaned alike.
 */
export function serializeError(err: unknown): unknown {
  const serialized = pino.stdSerializers.err(err as Error) as unknown;
  return withoutArguments(serialized, 0);
}

function withoutArguments(value: unknown, depth: number): unknown {
  if (value === null || typeof value !== 'object' || depth > 4) return value;
  const record = value as Record<string, unknown>;
  const command = record.command;
  if (command !== null && typeof command === 'object' && 'args' in command) {
    const { args: _args, ...rest } = command as Record<string, unknown>;
    record.command = rest;
  }
  delete record.sql;
  // A duplicate key's value (a phone number, an e-mail address) is in MySQL's message.
  delete record.sqlMessage;
  // A mail the server refused: nodemailer lists the recipients, and the server's answer and the
  // message usually name them too.
  for (const key of ['rejected', 'rejectedErrors', 'accepted', 'pending', 'envelope', 'recipient'])
    delete record[key];
  for (const key of ['message', 'stack', 'response'])
    if (typeof record[key] === 'string') record[key] = withoutAddresses(withoutDuplicateValue(record[key]));
  for (const key of ['cause', 'previousErrors', 'lastNodeError']) {
    if (record[key] !== undefined) record[key] = withoutArguments(record[key], depth + 1);
  }
  if (Array.isArray(record.aggregateErrors))
    record.aggregateErrors = record.aggregateErrors.map((e) => withoutArguments(e, depth + 1));
  return record;
}

/** E-mail addresses with their mailbox left out: `…@example.com` (the domain helps to tell a provider's refusals). */
function withoutAddresses(text: string): string {
  if (!text.includes('@')) return text;
  // Found from each `@` (a pattern starting at the mailbox would rescan long runs from every
  // start), the mailbox is what comes before it, back to a character that cannot be in one or to
  // the end of the address before: no character is looked at twice.
  let out = '';
  let from = 0;
  for (const match of text.matchAll(ADDRESS_DOMAIN)) {
    const at = match.index;
    let start = at;
    while (start > from && !MAILBOX_END.has(text[start - 1]!)) start--;
    if (start < at) out += `${text.slice(from, start)}…${match[0]}`;
    else out += text.slice(from, at + match[0].length);
    from = at + match[0].length;
  }
  return out + text.slice(from);
}

const ADDRESS_DOMAIN = /@[\p{L}\p{N}-]{1,63}(?:\.[\p{L}\p{N}-]{1,63}){1,8}/gu;
const MAILBOX_END = new Set([...' \t\r\n<>"\'(),;:@[]/=&?']);

function withoutDuplicateValue(message: string): string {
  return message.replace(/Duplicate entry '[\s\S]*?' for key/g, "Duplicate entry '…' for key");
}
