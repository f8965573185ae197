import { BadRequestError } from '../platform/errors/errors.js';
import type { IdentifierType } from './code-sender/code-sender.js';

const PHONE = /^1\d{10}$/;
/**
 * A plain address: a dot-atom local part (letters, digits and RFC 5322's atom symbols) at a host
 * name of at least two labels. No quoting, comments, groups, lists or display names: a mail library
 * reads `,` `;` `<` `>` `(` `)` `:` and `"` as address syntax, so an identifier holding them could
 * send a code to an address that is not the identifier.
 */
const EMAIL =
  /^[\p{L}\p{N}!#$%&'*+/=?^_`{|}~-]+(?:\.[\p{L}\p{N}!#$%&'*+/=?^_`{|}~-]+)*@(?:[\p{L}\p{N}](?:[\p{L}\p{N}-]{0,61}[\p{L}\p{N}])?\.)+(?:\p{L}{2,63}|xn--[a-z0-9-]{1,59})$/u;

/** Phone numbers are taken as typed; e-mail addresses are trimmed and lower-cased. */
export function normalizeIdentifier(type: IdentifierType, raw: string): string {
  const value = type === 'EMAIL' ? raw.trim().toLowerCase() : raw.trim();
  const ok =
    type === 'PHONE'
      ? PHONE.test(value)
      : EMAIL.test(value) && value.length <= 254 && value.indexOf('@') <= 64;
  if (!ok)
    throw new BadRequestError(
      `body.identifier is not a valid ${type === 'PHONE' ? 'phone number' : 'e-mail address'}`,
    );
  return value;
}
