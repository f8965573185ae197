/**
 * 64-bit time-ordered ids: 41 bits of milliseconds since 2024-01-01, 10 bits of worker id, 12 bits
 * of sequence (4,096 ids per millisecond per worker). Returned as decimal strings, since they do not
 * fit a double.
 *
 * Clock drift: the generator never issues a timestamp lower than the last one it used. If the clock
 * steps back, ids keep using the last timestamp and its sequence; when that sequence is used up, the
 * generator moves its own timestamp forward by one millisecond rather than waiting for the clock.
 * Ids therefore stay unique and increasing within a process; across processes, uniqueness rests on
 * distinct worker ids.
 */
export const SNOWFLAKE_EPOCH_MS = Date.UTC(2024, 0, 1);
const WORKER_BITS = 10n;
const SEQUENCE_BITS = 12n;
const MAX_SEQUENCE = (1n << SEQUENCE_BITS) - 1n;
export const MAX_WORKER_ID = (1 << Number(WORKER_BITS)) - 1;

export class SnowflakeGenerator {
  private lastMs = -1;
  private sequence = 0n;

  constructor(
    private readonly workerId: number,
    private readonly now: () => number = Date.now,
  ) {
    if (!Number.isInteger(workerId) || workerId < 0 || workerId > MAX_WORKER_ID) {
      throw new RangeError(`worker id must be an integer from 0 to ${MAX_WORKER_ID}`);
    }
  }

  next(): string {
    const clock = this.now() - SNOWFLAKE_EPOCH_MS;
    if (clock > this.lastMs) {
      this.lastMs = clock;
      this.sequence = 0n;
    } else if (this.sequence < MAX_SEQUENCE) {
      this.sequence++;
    } else {
      this.lastMs++;
      this.sequence = 0n;
    }
    const id =
      (BigInt(this.lastMs) << (WORKER_BITS + SEQUENCE_BITS)) |
      (BigInt(this.workerId) << SEQUENCE_BITS) |
      this.sequence;
    return id.toString();
  }
}

/** The parts of an id, for logs and tests. */
export function parseSnowflake(id: string): { timestampMs: number; workerId: number; sequence: number } {
  const value = BigInt(id);
  return {
    timestampMs: Number(value >> (WORKER_BITS + SEQUENCE_BITS)) + SNOWFLAKE_EPOCH_MS,
    workerId: Number((value >> SEQUENCE_BITS) & BigInt(MAX_WORKER_ID)),
    sequence: Number(value & MAX_SEQUENCE),
  };
}
