import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { migrate, openSqlite, type Db } from '../platform/db/database.js';
import { createSqliteKv } from '../platform/kv/create.js';
import type { KeyValueStore } from '../platform/kv/kv.js';
import { RecipientRefusedError, type CodeMessage, type CodeSender } from './code-sender/code-sender.js';
import { CODE_TTL_SECONDS, VerificationService } from './verification.js';

const CODE_TTL_MS = CODE_TTL_SECONDS * 1000;

class RecordingSender implements CodeSender {
  readonly sent: CodeMessage[] = [];
  failNext = false;
  /** Recipients the channel refuses (while it works for everyone else). */
  readonly refused = new Set<string>();
  async send(message: CodeMessage): Promise<void> {
    if (this.failNext) {
      this.failNext = false;
      throw new Error('mail server down');
    }
    if (this.refused.has(message.identifier)) throw new RecipientRefusedError('mailbox unavailable');
    this.sent.push(message);
  }
  last(): string {
    const code = this.sent.at(-1)?.code;
    if (!code) throw new Error('nothing sent');
    return code;
  }
}

describe(VerificationService.name, () => {
  let db: Db;
  let now: number;
  let sender: RecordingSender;
  let sut: VerificationService;
  let dir: string;

  beforeEach(async () => {
    dir = mkdtempSync(join(tmpdir(), 'zg-vc-'));
    db = openSqlite(join(dir, 'db.sqlite'));
    await migrate(db);
    now = Date.UTC(2026, 0, 10, 8, 0, 0);
    sender = new RecordingSender();
    sut = new VerificationService(createSqliteKv(db, { now: () => now }), sender, () => now);
  });
  afterEach(async () => {
    await db.close();
    rmSync(dir, { recursive: true, force: true });
  });

  /** A service over `kv` (the test's store by default) whose waits for unknown accounts pass at once. */
  const unwaited = (kv: KeyValueStore = createSqliteKv(db, { now: () => now })) =>
    new VerificationService(
      kv,
      sender,
      () => now,
      async () => undefined,
    );

  const errorCode = (p: Promise<unknown>) =>
    p.then(
      () => 'ok',
      (e: { code?: string }) => e.code ?? 'unknown',
    );

  it('sends six-digit codes that verify once', async () => {
    await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true);
    const code = sender.last();
    expect(code).toMatch(/^\d{6}$/);
    expect(sender.sent[0]).toMatchObject({ identifier: 'a@b.cd', scene: 'LOGIN', expireSeconds: 300 });
    expect(await errorCode(sut.verify('REGISTER', 'a@b.cd', code))).toBe('VERIFICATION_NOT_FOUND');
    expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', code))).toBe('ok');
    expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', code))).toBe('VERIFICATION_NOT_FOUND');
  });

  it('leaves a code a send stored while an old one was being checked to its owner', async () => {
    const kv = createSqliteKv(db, { now: () => now });
    let replaceOnce = false;
    // A send replaces the code (its tries and code go, a new one comes) right after this check
    // counted its try, with the code it read before.
    const racing: KeyValueStore = Object.assign(Object.create(kv) as KeyValueStore, {
      incr: async (key: string, by?: number, ttlMs?: number) => {
        const n = await kv.incr(key, by, ttlMs);
        if (replaceOnce) {
          replaceOnce = false;
          await kv.delete('vc:tries:LOGIN:a@b.cd');
          await kv.set('vc:code:LOGIN:a@b.cd', '424242', CODE_TTL_MS);
        }
        return n;
      },
    });
    const sut = unwaited(racing);
    await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true);
    replaceOnce = true;
    expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', sender.last()))).toBe('VERIFICATION_NOT_FOUND');
    expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', '424242'))).toBe('ok');
  });

  it('expires codes after five minutes', async () => {
    await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true);
    now += 300_001;
    expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', sender.last()))).toBe('VERIFICATION_NOT_FOUND');
  });

  it('allows one send per 60 seconds', async () => {
    await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true);
    now += 59_000;
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'a@b.cd', true))).toBe('VERIFICATION_RATE_LIMIT');
    now += 1_001;
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'a@b.cd', true))).toBe('ok');
    expect(sender.sent).toHaveLength(2);
  });

  it('allows ten sends a day and checks that before claiming the interval', async () => {
    for (let i = 0; i < 10; i++) {
      expect(await errorCode(sut.send('REGISTER', 'EMAIL', 'a@b.cd', true))).toBe('ok');
      now += 61_000;
    }
    expect(await errorCode(sut.send('REGISTER', 'EMAIL', 'a@b.cd', true))).toBe('VERIFICATION_DAILY_LIMIT');
    // other scenes and identifiers have their own budgets
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'a@b.cd', true))).toBe('ok');
    now = Date.UTC(2026, 0, 11, 0, 0, 1);
    expect(await errorCode(sut.send('REGISTER', 'EMAIL', 'a@b.cd', true))).toBe('ok');
  });

  it('kills the code after five wrong attempts', async () => {
    await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true);
    const code = sender.last();
    const wrong = code === '000000' ? '000001' : '000000';
    for (let i = 0; i < 5; i++)
      expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', wrong))).toBe('VERIFICATION_MISMATCH');
    expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', code))).toBe('VERIFICATION_TOO_MANY_ATTEMPTS');
    // a new code starts a fresh count
    now += 61_000;
    await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true);
    expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', sender.last()))).toBe('ok');
  });

  it('counts parallel guesses atomically', async () => {
    await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true);
    const code = sender.last();
    const wrong = code === '000000' ? '000001' : '000000';
    const results = await Promise.all(
      Array.from({ length: 20 }, () => errorCode(sut.verify('LOGIN', 'a@b.cd', wrong))),
    );
    expect(results.filter((r) => r === 'VERIFICATION_MISMATCH')).toHaveLength(5);
    expect(results.filter((r) => r === 'VERIFICATION_TOO_MANY_ATTEMPTS')).toHaveLength(15);
    expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', code))).toBe('VERIFICATION_TOO_MANY_ATTEMPTS');
  });

  it('withdraws a code that could not be delivered, so the person can ask again at once', async () => {
    sender.failNext = true;
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'a@b.cd', true))).toBe('UNAVAILABLE');
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'a@b.cd', true))).toBe('ok');
  });

  it('answers checks for an unknown account exactly as for a known one, and sends nothing', async () => {
    await sut.send('LOGIN', 'EMAIL', 'ghost@b.cd', false);
    await sut.send('LOGIN', 'EMAIL', 'real@b.cd', true);
    const real = sender.last();
    expect(sender.sent).toHaveLength(1);
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'ghost@b.cd', false))).toBe('VERIFICATION_RATE_LIMIT');
    const wrong = real === '000000' ? '000001' : '000000';
    for (const who of ['ghost@b.cd', 'real@b.cd']) {
      for (let i = 0; i < 5; i++)
        expect(await errorCode(sut.verify('LOGIN', who, wrong))).toBe('VERIFICATION_MISMATCH');
      expect(await errorCode(sut.verify('LOGIN', who, wrong))).toBe('VERIFICATION_TOO_MANY_ATTEMPTS');
    }
    expect(await errorCode(sut.verify('LOGIN', 'nobody@b.cd', wrong))).toBe('VERIFICATION_NOT_FOUND');
  });

  it('takes as long for an unknown account as one of the last deliveries took', async () => {
    const waits: number[] = [];
    let deliveryMs = 0;
    const slow: CodeSender = {
      send: async (message) => {
        await new Promise((resolve) => setTimeout(resolve, deliveryMs));
        await sender.send(message);
      },
    };
    const timed = new VerificationService(
      createSqliteKv(db, { now: () => now }),
      slow,
      () => now,
      async (ms) => {
        waits.push(ms);
      },
    );
    // No delivery timed yet: a fixed half second.
    await timed.send('LOGIN', 'EMAIL', 'ghost0@b.cd', false);
    expect(waits).toEqual([500]);
    deliveryMs = 120;
    await timed.send('LOGIN', 'EMAIL', 'real@b.cd', true);
    await timed.send('LOGIN', 'EMAIL', 'ghost1@b.cd', false);
    expect(waits).toHaveLength(2);
    expect(waits[1]).toBeGreaterThanOrEqual(100);
    expect(waits[1]).toBeLessThanOrEqual(400);
    // Asked again once the interval passed, while the first value is live: the same kind of wait.
    now += 61_000;
    await timed.send('LOGIN', 'EMAIL', 'ghost1@b.cd', false);
    expect(waits).toHaveLength(3);
    expect(waits[2]).toBe(waits[1]);
    // Per channel: no phone delivery was timed.
    await timed.send('LOGIN', 'PHONE', '13800000000', false);
    expect(waits.at(-1)).toBe(500);
  });

  it('counts every try at a new code against it, also one that overlapped the send', async () => {
    const kv = createSqliteKv(db, { now: () => now });
    // Holds the next check between its first and its second step.
    let hold: { steps: number; release: Promise<void>; reached: () => void } | undefined;
    const held = Object.create(kv) as typeof kv;
    const step = async <T>(run: () => Promise<T>): Promise<T> => {
      if (hold && ++hold.steps === 2) {
        const { release, reached } = hold;
        hold = undefined;
        reached();
        await release;
      }
      return run();
    };
    held.get = (key) => step(() => kv.get(key));
    held.incr = (key, by, ttl) => step(() => kv.incr(key, by, ttl));
    const timed = unwaited(held);
    await timed.send('LOGIN', 'EMAIL', 'real@b.cd', true);
    now += CODE_TTL_MS + 1; // the code expired: the next send makes a new one

    let release!: () => void;
    let reached!: () => void;
    const atSecondStep = new Promise<void>((resolve) => (reached = resolve));
    hold = { steps: 0, release: new Promise<void>((resolve) => (release = resolve)), reached };
    const overlapping = errorCode(timed.verify('LOGIN', 'real@b.cd', '000000'));
    await atSecondStep;
    await timed.send('LOGIN', 'EMAIL', 'real@b.cd', true);
    release();
    const wrong = sender.last() === '000001' ? '000002' : '000001';
    const outcomes = [await overlapping];
    for (let i = 0; i < 6; i++) outcomes.push(await errorCode(timed.verify('LOGIN', 'real@b.cd', wrong)));
    // At most five tries are compared with the new code, the overlapping one among them if it was.
    expect(outcomes.filter((o) => o === 'VERIFICATION_MISMATCH').length).toBeLessThanOrEqual(5);
    expect(outcomes.at(-1)).toBe('VERIFICATION_TOO_MANY_ATTEMPTS');
  });

  it('does not take a used-up code while a send replaces it', async () => {
    const kv = createSqliteKv(db, { now: () => now });
    let holdSet: { release: Promise<void>; reached: () => void } | undefined;
    const held = Object.create(kv) as typeof kv;
    held.set = async (key, value, ttl) => {
      if (holdSet && key.startsWith('vc:code:')) {
        const { release, reached } = holdSet;
        holdSet = undefined;
        reached();
        await release;
      }
      return kv.set(key, value, ttl);
    };
    const timed = unwaited(held);
    await timed.send('LOGIN', 'EMAIL', 'real@b.cd', true);
    const used = sender.last();
    const wrong = used === '000000' ? '000001' : '000000';
    for (let i = 0; i < 5; i++) await timed.verify('LOGIN', 'real@b.cd', wrong).catch(() => undefined);
    now += 61_000;
    let release!: () => void;
    let reached!: () => void;
    const atSet = new Promise<void>((resolve) => (reached = resolve));
    holdSet = { release: new Promise<void>((resolve) => (release = resolve)), reached };
    const sending = timed.send('LOGIN', 'EMAIL', 'real@b.cd', true);
    await atSet; // the used-up code is being replaced
    expect(await errorCode(timed.verify('LOGIN', 'real@b.cd', used))).not.toBe('ok');
    release();
    await sending;
  });

  it('answers an unknown account as a real one while deliveries fail, also afterwards', async () => {
    const timed = unwaited();
    const wrong = '000000';
    for (const [who, real] of [
      ['real@b.cd', true],
      ['ghost@b.cd', false],
    ] as const) {
      await timed.send('LOGIN', 'EMAIL', who, real);
      for (let i = 0; i < 5; i++) await timed.verify('LOGIN', who, wrong).catch(() => undefined);
    }
    now += 61_000;
    const answers: string[] = [];
    for (const [who, real] of [
      ['real@b.cd', true],
      ['ghost@b.cd', false],
    ] as const) {
      sender.failNext = real;
      answers.push(await errorCode(timed.send('LOGIN', 'EMAIL', who, real)));
      answers.push(await errorCode(timed.verify('LOGIN', who, wrong)));
    }
    expect(answers).toEqual([
      'UNAVAILABLE',
      'VERIFICATION_NOT_FOUND',
      'UNAVAILABLE',
      'VERIFICATION_NOT_FOUND',
    ]);
  });

  it('fails sends to unknown accounts while deliveries fail, as it fails them to real ones', async () => {
    sender.failNext = true;
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'real@b.cd', true))).toBe('UNAVAILABLE');
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'ghost@b.cd', false))).toBe('UNAVAILABLE');
    // and, like a real one, may ask again at once
    now += 29_000;
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'ghost@b.cd', false))).toBe('UNAVAILABLE');
    // other kinds of identifier are not held by a failing mail server
    expect(await errorCode(sut.send('LOGIN', 'PHONE', '13800138000', false))).toBe('ok');
    now += 1_001;
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'ghost@b.cd', false))).toBe('ok');
    // a delivery that works ends it at once
    sender.failNext = true;
    now += 61_000;
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'real@b.cd', true))).toBe('UNAVAILABLE');
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'real@b.cd', true))).toBe('ok');
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'ghost2@b.cd', false))).toBe('ok');
  });

  it('does not take a refused recipient for an outage: unknown accounts still answer as real ones', async () => {
    // Anyone can have a sign-up code sent to an address the mail server refuses...
    sender.refused.add('bounce@b.cd');
    expect(await errorCode(sut.send('REGISTER', 'EMAIL', 'bounce@b.cd', true))).toBe('UNAVAILABLE');
    // ...which must not make sends to unknown accounts fail while those to real ones go out.
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'ghost@b.cd', false))).toBe('ok');
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'real@b.cd', true))).toBe('ok');
    // Nor does one registered account whose owner made its mailbox refuse mail...
    now += 61_000;
    sender.refused.add('real@b.cd');
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'real@b.cd', true))).toBe('UNAVAILABLE');
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'ghost3@b.cd', false))).toBe('ok');
    now += 61_000;
    expect(await errorCode(sut.send('RESET_PASSWORD', 'EMAIL', 'real@b.cd', true))).toBe('UNAVAILABLE');
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'ghost4@b.cd', false))).toBe('ok');
    // ...but refusals of several registered accounts within the window do: the channel may refuse everyone.
    sender.refused.add('real3@b.cd');
    sender.refused.add('real4@b.cd');
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'real3@b.cd', true))).toBe('UNAVAILABLE');
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'ghost5@b.cd', false))).toBe('ok');
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'real4@b.cd', true))).toBe('UNAVAILABLE');
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'ghost6@b.cd', false))).toBe('UNAVAILABLE');
    sender.refused.clear();
    now += 31_000;
    // A failing channel still does.
    sender.failNext = true;
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'real2@b.cd', true))).toBe('UNAVAILABLE');
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'ghost2@b.cd', false))).toBe('UNAVAILABLE');
  });

  it('sends a live code again instead of voiding it, with the time it has left, and keeps counting its tries', async () => {
    await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true);
    const first = sender.last();
    const wrong = first === '000000' ? '000001' : '000000';
    for (let i = 0; i < 3; i++) await sut.verify('LOGIN', 'a@b.cd', wrong).catch(() => undefined);
    // someone else asks for a code for this address three minutes later
    now += 180_000;
    expect(await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true)).toBe(120);
    expect(sender.sent).toHaveLength(2);
    expect(sender.last()).toBe(first);
    expect(sender.sent[1]?.expireSeconds).toBe(120);
    // the code lives its five minutes, with its tries going on
    now += 119_000;
    expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', wrong))).toBe('VERIFICATION_MISMATCH');
    expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', first))).toBe('ok');
  });

  it('replaces a live code with less than a minute left, which nobody could use after the next wait', async () => {
    await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true);
    const first = sender.last();
    now += 241_000;
    expect(await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true)).toBe(300);
    const second = sender.last();
    expect(sender.sent[1]?.expireSeconds).toBe(300);
    if (second !== first)
      expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', first))).toBe('VERIFICATION_MISMATCH');
    now += 299_000;
    expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', second))).toBe('ok');
  });

  it('ends a code five minutes after it was made, however often it is sent again', async () => {
    await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true);
    const first = sender.last();
    for (let i = 0; i < 3; i++) {
      now += 61_000;
      await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true);
      expect(sender.last()).toBe(first);
    }
    now += 300_000 - 3 * 61_000 + 1;
    expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', first))).toBe('VERIFICATION_NOT_FOUND');
  });

  it('sends a new code instead of one whose tries are used up', async () => {
    await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true);
    const first = sender.last();
    const wrong = first === '000000' ? '000001' : '000000';
    for (let i = 0; i < 5; i++)
      expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', wrong))).toBe('VERIFICATION_MISMATCH');
    now += 61_000;
    await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true);
    expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', sender.last()))).toBe('ok');
  });

  it('sends a new code once the old one is used, and keeps a sent code when a resend fails', async () => {
    await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true);
    const first = sender.last();
    now += 61_000;
    sender.failNext = true;
    expect(await errorCode(sut.send('LOGIN', 'EMAIL', 'a@b.cd', true))).toBe('UNAVAILABLE');
    expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', first))).toBe('ok');
    await sut.send('LOGIN', 'EMAIL', 'a@b.cd', true);
    expect(sender.sent).toHaveLength(2);
    expect(await errorCode(sut.verify('LOGIN', 'a@b.cd', sender.last()))).toBe('ok');
  });

  it('sends a real code to an identifier that registered after an undelivered send', async () => {
    await sut.send('LOGIN', 'EMAIL', 'new@b.cd', false);
    now += 61_000;
    await sut.send('LOGIN', 'EMAIL', 'new@b.cd', true);
    expect(sender.last()).toMatch(/^\d{6}$/);
    expect(await errorCode(sut.verify('LOGIN', 'new@b.cd', sender.last()))).toBe('ok');
  });
});
