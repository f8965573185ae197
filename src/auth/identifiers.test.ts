import { describe, expect, it } from 'vitest';
import { AppError } from '../platform/errors/errors.js';
import { normalizeIdentifier } from './identifiers.js';

const email = (raw: string) => {
  try {
    return normalizeIdentifier('EMAIL', raw);
  } catch (err) {
    if (err instanceof AppError) return `${err.status} ${err.code}`;
    throw err;
  }
};

describe(normalizeIdentifier.name, () => {
  it('takes plain addresses, trimmed and lower-cased', () => {
    expect(email(' Ada.Lovelace+zg@Example.COM ')).toBe('ada.lovelace+zg@example.com');
    expect(email("o'brien_1@mail.example.co.uk")).toBe("o'brien_1@mail.example.co.uk");
    expect(email('张三@例子.中国')).toBe('张三@例子.中国');
    expect(email('a@xn--fiqs8s')).toBe('400 BAD_REQUEST');
    expect(email('a@mail.xn--fiqs8s')).toBe('a@mail.中国');
  });

  it('gives every spelling of one mailbox one identifier', () => {
    for (const raw of [
      '张三@mail.例子.中国',
      '张三@MAIL.例子.中国',
      '张三@mail.xn--fsqu00a.xn--fiqs8s',
      '张三@ｍａｉｌ.例子.中国',
      '张三@mail。例子。中国',
      '张三@mail.例子.中国'.normalize('NFD'),
    ])
      expect({ raw, got: email(raw) }).toEqual({ raw, got: '张三@mail.例子.中国' });
    expect(email('josé@example.com'.normalize('NFD'))).toBe('josé@example.com'.normalize('NFC'));
    expect(email('a@exa mple.com')).toBe('400 BAD_REQUEST');
  });

  it('takes host names of any script IDNA takes, in either form, marks included', () => {
    expect(email('a@mail.xn--h2brj9c')).toBe('a@mail.भारत');
    expect(email('a@mail.भारत')).toBe('a@mail.भारत');
    expect(email('a@xn--11b4c3d.com')).toBe('a@कॉम.com');
    expect(email('a@xn--ls8h.la')).toBe('a@💩.la');
    expect(email('अनु@example.com')).toBe('अनु@example.com');
  });

  it('refuses what a mail library would read as other addresses, and malformed ones', () => {
    for (const raw of [
      'x,victim@example.com',
      'x;victim@example.com',
      'victim<attacker@example.com>',
      'a(c)victim@example.com',
      'x:victim@example.com;',
      '"a b"@example.com',
      'a b@example.com',
      'a..b@example.com',
      '.a@example.com',
      'a.@example.com',
      'a@example',
      'a@-example.com',
      'a@example-.com',
      'a@exa_mple.com',
      'a@example.c',
      'a@@example.com',
      `${'a'.repeat(65)}@example.com`,
      `a@${'b'.repeat(250)}.com`,
    ])
      expect({ raw, got: email(raw) }).toEqual({ raw, got: '400 BAD_REQUEST' });
  });

  it('takes mainland mobile numbers as typed', () => {
    expect(normalizeIdentifier('PHONE', ' 13800138000 ')).toBe('13800138000');
    expect(() => normalizeIdentifier('PHONE', '+8613800138000')).toThrow(AppError);
  });
});
