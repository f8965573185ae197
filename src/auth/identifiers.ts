import { domainToASCII, domainToUnicode } from 'node:url';
import { BadRequestError } from '../platform/errors/errors.js';
import type { IdentifierType } from './code-sender/code-sender.js';

const PHONE = /^1\d{10}$/;
/**
 * A plain address: a dot-atom local part (letters with their marks, digits and RFC 5322's atom
 * symbols) at a host name of at least two labels, judged by its ASCII form (so any script IDNA
 * takes is a host name, and `xn--` labels are too). No quoting, comments, groups, lists or display
 * names: a mail library reads `,` `;` `<` `>` `(` `)` `:` and `"` as address syntax, so an
 * identifier holding them could send a code to an address that is not the identifier.
 */
const LOCAL_PART = /^[\p{L}\p{M}\p{N}!#$%&'*+/=?^_`{|}~-]+(?:\.[\p{L}\p{M}\p{N}!#$%&'*+/=?^_`{|}~-]+)*$/u;
const ASCII_HOST = /^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+(?:[a-z]{2,63}|xn--[a-z0-9-]{1,59})$/;

function isEmail(value: string): boolean {
  const at = value.lastIndexOf('@');
  if (at < 1 || at > 64 || value.length > 254) return false;
  const host = domainToASCII(value.slice(at + 1));
  return LOCAL_PART.test(value.slice(0, at)) && host.length <= 253 && ASCII_HOST.test(host);
}

/**
 * Phone numbers are taken as typed. E-mail addresses are trimmed and put in the one form every
 * spelling of the same mailbox shares (see `canonicalEmail`), so that one mailbox is one account.
 */
export function normalizeIdentifier(type: IdentifierType, raw: string): string {
  const value = type === 'EMAIL' ? canonicalEmail(raw.trim()) : raw.trim();
  const ok = type === 'PHONE' ? PHONE.test(value) : isEmail(value);
  if (!ok)
    throw new BadRequestError(
      `body.identifier is not a valid ${type === 'PHONE' ? 'phone number' : 'e-mail address'}`,
    );
  return value;
}

/**
 * The local part in Unicode normal form C, lower-cased; the host name as IDNA maps it, in Unicode.
 * Mail is delivered to the host's ASCII form, so `a@mail.xn--fiqs8s`, `a@mail.中国` and
 * `a@ｍａｉｌ.中国` (full-width letters, as an input method types them) reach one mailbox and are
 * one identifier here. A host name IDNA refuses becomes empty, which the address check refuses.
 * (Migration 0015 keeps the same rule, written out on its own, for the addresses stored before it.)
 */
export function canonicalEmail(value: string): string {
  const at = value.lastIndexOf('@');
  const local = (at < 0 ? value : value.slice(0, at)).normalize('NFC').toLowerCase();
  return at < 0 ? local : `${local}@${domainToUnicode(value.slice(at + 1))}`;
}
