import { BadRequestError } from '../platform/errors/errors.js';
import type { IdentifierType } from './code-sender/code-sender.js';

const PHONE = /^1\d{10}$/;
const EMAIL = /^[^\s@]{1,64}@[^\s@]+\.[^\s@]{2,}$/;

/** Phone numbers are taken as typed; e-mail addresses are trimmed and lower-cased. */
export function normalizeIdentifier(type: IdentifierType, raw: string): string {
  const value = type === 'EMAIL' ? raw.trim().toLowerCase() : raw.trim();
  const ok = type === 'PHONE' ? PHONE.test(value) : EMAIL.test(value) && value.length <= 254;
  if (!ok)
    throw new BadRequestError(
      `body.identifier is not a valid ${type === 'PHONE' ? 'phone number' : 'e-mail address'}`,
    );
  return value;
}
