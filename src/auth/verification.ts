import { randomBytes, randomInt, timingSafeEqual } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { AppError, RateLimitedError, UnavailableError } from '../platform/errors/errors.js';
import type { KeyValueStore } from '../platform/kv/kv.js';
import {
  RecipientRefusedError,
  type CodeMessage,
  type CodeSender,
  type IdentifierType,
  type Scene,
} from './code-sender/code-sender.js';

export const CODE_TTL_SECONDS = 300;
const SEND_INTERVAL_MS = 60_000;
const DAILY_LIMIT = 10;
const MAX_ATTEMPTS = 5;
const DAY_MS = 86_400_000;
/** Recent delivery times per identifier type that the wait for unknown accounts draws from. */
const DELIVERY_SAMPLES = 32;
/** That wait before this process has timed a delivery of the kind. */
const FIRST_DELIVERY_MS = 500;
/** How long after a failed delivery a send to an unknown account fails too, as a real one would. */
const OUTAGE_MS = 30_000;
/**
 * Registered recipients whose refusals within `OUTAGE_MS` make an outage: the channel refusing
 * everyone, not one account whose owner made their own mailbox refuse mail to switch it on.
 */
const REFUSED_RECIPIENTS_FOR_OUTAGE = 3;

export class VerificationError extends AppError {
  constructor(code: 'VERIFICATION_NOT_FOUND' | 'VERIFICATION_MISMATCH', message: string) {
    super(code, message, 400);
  }
}

/**
 * Six-digit codes per (scene, identifier): 5 minutes of life, one send per 60 s, 10 sends a day,
 * 5 attempts. Attempts are counted with an atomic increment *before* the comparison, so parallel
 * guesses cannot get past the limit; past it the code is refused until a send replaces it. The daily limit is checked before
 * the send interval is claimed, so a refused send does not start an interval either.
 */
export class VerificationService {
  /**
   * When a delivery last failed here for the channel's sake, per identifier type; cleared by the
   * next one that works.
   */
  private readonly failedAt = new Map<IdentifierType, number>();
  /**
   * How long the last deliveries that worked took here, per identifier type: a send to an unknown
   * account, which delivers nothing, waits as long as one of them drawn at random (their spread,
   * long tail included), so the time of the answer does not tell who is registered either.
   */
  private readonly deliveryMs = new Map<IdentifierType, number[]>();
  /** The same for deliveries that failed: how long an unknown account's send fails in an outage. */
  private readonly failedMs = new Map<IdentifierType, number[]>();
  /** Registered recipients the channel refused lately, with when, per identifier type. */
  private readonly refusedAt = new Map<IdentifierType, Map<string, number>>();

  constructor(
    private readonly kv: KeyValueStore,
    private readonly sender: CodeSender,
    private readonly now: () => number = Date.now,
    private readonly wait: (ms: number) => Promise<unknown> = sleep,
  ) {}

  /** Whether codes can be sent to identifiers of this type here at all. */
  delivers(type: IdentifierType): boolean {
    return this.sender.delivers?.(type) ?? true;
  }

  /**
   * `deliver: false` (unknown accounts) runs the same limits and stores a value no code matches, so
   * later checks cannot tell the account is unknown; nothing is sent. Resolves to the seconds the
   * code has left to live.
   */
  async send(
    scene: Scene,
    identifierType: IdentifierType,
    identifier: string,
    deliver: boolean,
  ): Promise<number> {
    const id = `${scene}:${identifier}`;
    const day = Math.floor(this.now() / DAY_MS);
    const dailyKey = `vc:day:${id}:${day}`;
    const sentToday = Number((await this.kv.get(dailyKey)) ?? 0);
    if (sentToday >= DAILY_LIMIT) {
      throw new RateLimitedError(
        'Daily verification code limit reached',
        secondsUntil(DAY_MS - (this.now() % DAY_MS)),
        'VERIFICATION_DAILY_LIMIT',
      );
    }
    if (!(await this.kv.setIfAbsent(`vc:gap:${id}`, '1', SEND_INTERVAL_MS))) {
      const left = (await this.kv.ttl(`vc:gap:${id}`)) ?? SEND_INTERVAL_MS;
      throw new RateLimitedError(
        'A code was sent recently; wait before asking again',
        secondsUntil(left),
        'VERIFICATION_RATE_LIMIT',
      );
    }
    await this.kv.incr(dailyKey, 1, DAY_MS + 3_600_000);

    const codeKey = `vc:code:${id}`;
    const ttlMs = CODE_TTL_SECONDS * 1000;
    // A live code is sent again rather than replaced: asking for a code on someone else's identifier
    // must not void the one already in their inbox. It keeps its lifetime (sending it again must not
    // keep a code seen somewhere alive for ever), so one with less than a send interval left, which
    // nobody could use after waiting for the next send, is replaced. Its tries go on counting, so
    // one with none left is replaced too.
    const [live = null, tries = null] = await this.kv.mget([codeKey, `vc:tries:${id}`]);
    const left =
      live !== null && (!deliver || isCode(live)) && Number(tries ?? 0) < MAX_ATTEMPTS
        ? await this.kv.ttl(codeKey)
        : null;
    if (left !== null && left >= SEND_INTERVAL_MS) {
      const expireSeconds = Math.floor(left / 1000);
      if (deliver)
        await this.deliver({ scene, identifierType, identifier, code: live! }, id, false, expireSeconds);
      else await this.asIfDelivered(identifierType, id, false);
      return expireSeconds;
    }
    // An unknown account gets a value no code can match, so checking a code answers as it would for
    // a registered one.
    const code = deliver ? String(randomInt(0, 1_000_000)).padStart(6, '0') : unmatchable();
    // The old code and its tries go before the new code comes, and a check reads the code before it
    // counts its try: every try at the new code is counted against it, even one that overlaps this
    // send, and the old one cannot be tried again with its tries cleared.
    await this.kv.delete(codeKey);
    await this.kv.delete(`vc:tries:${id}`);
    await this.kv.set(codeKey, code, ttlMs);
    if (deliver) await this.deliver({ scene, identifierType, identifier, code }, id, true, CODE_TTL_SECONDS);
    else await this.asIfDelivered(identifierType, id, true);
    return CODE_TTL_SECONDS;
  }

  /**
   * What a delivery to a real account would have done, for an unknown one: wait as long as one of
   * the last deliveries of the kind took, and while deliveries fail, fail as they do (after as long
   * as a failed one took, withdrawing a new value and freeing the interval), so neither the answer
   * nor its time tells who is registered.
   */
  private async asIfDelivered(type: IdentifierType, id: string, fresh: boolean): Promise<void> {
    const failing = this.now() - (this.failedAt.get(type) ?? -Infinity) < OUTAGE_MS;
    const times = (failing ? this.failedMs : this.deliveryMs).get(type);
    await this.wait(times && times.length > 0 ? times[randomInt(times.length)]! : FIRST_DELIVERY_MS);
    if (!failing) return;
    if (fresh) await this.kv.delete(`vc:code:${id}`);
    await this.kv.delete(`vc:gap:${id}`);
    throw undelivered();
  }

  private async deliver(
    message: Omit<CodeMessage, 'expireSeconds'>,
    id: string,
    fresh: boolean,
    expireSeconds: number,
  ): Promise<void> {
    const started = performance.now();
    try {
      await this.sender.send({ ...message, expireSeconds });
      remember(this.deliveryMs, message.identifierType, performance.now() - started);
      this.failedAt.delete(message.identifierType);
      this.refusedAt.delete(message.identifierType);
    } catch (err) {
      remember(this.failedMs, message.identifierType, performance.now() - started);
      // An outage mode switched on at will would tell unknown accounts from real ones, so a refused
      // recipient counts only as one of several registered ones refused lately (a relay refusing
      // everyone): anyone may ask for a sign-up code to an address of their choosing, and the owner
      // of an account may make its own mailbox refuse mail. Any other failure counts at once.
      if (!(err instanceof RecipientRefusedError)) this.failedAt.set(message.identifierType, this.now());
      else if (message.scene !== 'REGISTER' && this.refusedLately(message.identifierType, message.identifier))
        this.failedAt.set(message.identifierType, this.now());
      // A new code nobody received is withdrawn; a code sent before stays valid.
      if (fresh) await this.kv.delete(`vc:code:${id}`);
      await this.kv.delete(`vc:gap:${id}`);
      throw undelivered(err);
    }
  }

  /** Records a refusal of `identifier`; whether enough distinct recipients were refused lately to call it an outage. */
  private refusedLately(type: IdentifierType, identifier: string): boolean {
    const now = this.now();
    let refused = this.refusedAt.get(type);
    if (!refused) this.refusedAt.set(type, (refused = new Map<string, number>()));
    refused.delete(identifier);
    refused.set(identifier, now);
    // Oldest first: what is past the window, and past a few hundred, goes.
    for (const [id, at] of refused) {
      if (now - at < OUTAGE_MS && refused.size <= 256) break;
      refused.delete(id);
    }
    return refused.size >= REFUSED_RECIPIENTS_FOR_OUTAGE;
  }

  /** Consumes the code when it matches; throws the contract's verification errors otherwise. */
  async verify(scene: Scene, identifier: string, code: string): Promise<void> {
    const id = `${scene}:${identifier}`;
    // Read before the try is counted (see `send`).
    const stored = await this.kv.get(`vc:code:${id}`);
    const tries = await this.kv.incr(`vc:tries:${id}`, 1, CODE_TTL_SECONDS * 1000);
    if (tries > MAX_ATTEMPTS) {
      // The code stays, refused by its count, until a send replaces it: deleting it here could take
      // the one a send just stored, when this try was counted before that send cleared the tries.
      throw new RateLimitedError(
        'Too many wrong codes; ask for a new one',
        undefined,
        'VERIFICATION_TOO_MANY_ATTEMPTS',
      );
    }
    if (stored === null)
      throw new VerificationError('VERIFICATION_NOT_FOUND', 'No valid code; ask for a new one');
    if (!sameCode(stored, code)) throw new VerificationError('VERIFICATION_MISMATCH', 'The code is wrong');
    // Whoever takes the code first owns it; a concurrent second use finds nothing. Only this code
    // goes: one a send stored since it was read stays for its owner, and so do the tries counted
    // against it (these tries expire with the code, and a send clears them before its new code).
    if (!(await this.kv.deleteIfEquals(`vc:code:${id}`, stored))) {
      throw new VerificationError('VERIFICATION_NOT_FOUND', 'No valid code; ask for a new one');
    }
  }
}

function undelivered(cause?: unknown): UnavailableError {
  return new UnavailableError(
    'The verification code could not be delivered; try again later',
    cause === undefined ? undefined : { cause },
  );
}

function isCode(value: string): boolean {
  return /^\d{6}$/.test(value);
}

function unmatchable(): string {
  return `-${randomBytes(16).toString('hex')}`;
}

function sameCode(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

function secondsUntil(ms: number): number {
  return Math.max(1, Math.ceil(ms / 1000));
}

/** Adds a time to a kind's last `DELIVERY_SAMPLES`. */
function remember(times: Map<IdentifierType, number[]>, type: IdentifierType, ms: number): void {
  const last = times.get(type) ?? [];
  last.push(ms);
  if (last.length > DELIVERY_SAMPLES) last.shift();
  times.set(type, last);
}
