import type { LoggedViews } from './store/counter-store.js';

/**
 * What a counter store knows it added from one partition of the views log (`read-events`), kept
 * beside the views it covers and written in the same atomic step (per group on Redis, for the whole
 * store on SQLite; see `CounterStore.addLoggedViews`): ranges of offsets each record of which was
 * added, as far as it carried views of entities there, and the latest time among those records.
 * Ranges rather than one highest offset, because records need not come in order: a member can be
 * handed records it fetched before a rebalance after records of the same partition it never
 * handled, which come again later. Written as `ts:lo-hi,lo-hi,…`.
 */
export interface ViewMark {
  /** The latest record time (ms) among the records added. */
  ts: number;
  /** Inclusive, sorted, disjoint and not adjacent. */
  ranges: OffsetRange[];
}

export type OffsetRange = readonly [bigint, bigint];

/**
 * Ranges a mark keeps at most; past them the two lowest are merged, the gap between them taken as
 * added. A mark gets a range more when records come out of order (a rebalance hands a member
 * records it fetched before others it never handled: the gap is handed soon after and merged
 * away) and, on Redis, where marks are per group, when a partition changes hands: the new member's
 * run starts after records that carried no views of the group, a gap nothing fills. The lowest gap
 * is of the oldest such change, long handled.
 */
export const VIEW_MARK_RANGES = 16;

const MARK = /^(\d{1,16}):(\d{1,20}-\d{1,20}(?:,\d{1,20}-\d{1,20})*)$/;

/** A mark as `formatViewMark` wrote it; null for none, or for one that is not (then nothing is taken as added). */
export function parseViewMark(value: string | null | undefined): ViewMark | null {
  if (!value) return null;
  const match = MARK.exec(value);
  if (!match) return null;
  const ranges: OffsetRange[] = [];
  for (const text of match[2]!.split(',')) {
    const [lo, hi] = text.split('-').map(BigInt) as [bigint, bigint];
    const previous = ranges[ranges.length - 1];
    if (hi < lo || (previous && lo <= previous[1] + 1n)) return null;
    ranges.push([lo, hi]);
  }
  return { ts: Number(match[1]), ranges };
}

export function formatViewMark(mark: ViewMark): string {
  return `${mark.ts}:${mark.ranges.map(([lo, hi]) => `${lo}-${hi}`).join(',')}`;
}

/** The ranges of consecutive offsets among `offsets` (any order, repeats allowed). */
export function offsetRuns(offsets: Iterable<bigint>): OffsetRange[] {
  const sorted = [...new Set(offsets)].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  const runs: [bigint, bigint][] = [];
  for (const offset of sorted) {
    const last = runs[runs.length - 1];
    if (last && offset === last[1] + 1n) last[1] = offset;
    else runs.push([offset, offset]);
  }
  return runs;
}

/** Whether `offset` lies in one of `ranges` (sorted, disjoint). */
export function inRanges(ranges: readonly OffsetRange[], offset: bigint): boolean {
  let lo = 0;
  let hi = ranges.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    const [from, to] = ranges[mid]!;
    if (offset < from) hi = mid - 1;
    else if (offset > to) lo = mid + 1;
    else return true;
  }
  return false;
}

/**
 * Adding `records` of one partition where `mark` is kept: which of them are to be added (not at an
 * offset in one of its ranges, or later than its time), and the mark once they are, holding besides
 * the ranges `covered` (each record of which is among `records` or was added before; each record's
 * offset lies in one). A record in a range but later than the mark's time is of a topic made again,
 * whose offsets restarted: the old mark is dropped.
 */
export function planViewMark(
  mark: ViewMark | null,
  covered: readonly OffsetRange[],
  records: readonly { offset: bigint; timestamp: number }[],
): { add: boolean[]; next: ViewMark } {
  const restarted =
    mark !== null && records.some((r) => r.timestamp > mark.ts && inRanges(mark.ranges, r.offset));
  const base = restarted ? null : mark;
  let ts = base?.ts ?? 0;
  // A record handed twice in one call (the stream's buffer, then the same records read again after
  // a rebalance) is added once.
  const seen = new Set<bigint>();
  const add = records.map((r) => {
    if (r.timestamp > ts) ts = r.timestamp;
    if (seen.has(r.offset)) return false;
    seen.add(r.offset);
    return !(base && r.timestamp <= base.ts && inRanges(base.ranges, r.offset));
  });
  const ranges = mergeRanges([...(base?.ranges ?? []), ...covered]) as [bigint, bigint][];
  // The lowest ranges become one, with the gaps between them (a catch-up on SQLite, whose offsets
  // are shared by every topic, may bring thousands of ranges at once).
  const excess = ranges.length - VIEW_MARK_RANGES;
  if (excess > 0) ranges.splice(0, excess + 1, [ranges[0]![0], ranges[excess]![1]]);
  return { add, next: { ts, ranges } };
}

/** `planViewMark` for a mark as a store keeps it (`formatViewMark`'s text, or none), with the text to keep. */
export function planStoredViewMark(
  stored: string | null | undefined,
  covered: readonly OffsetRange[],
  records: readonly { offset: bigint; timestamp: number }[],
): { add: boolean[]; next: string } {
  const { add, next } = planViewMark(parseViewMark(stored), covered, records);
  return { add, next: formatViewMark(next) };
}

/** `ranges` sorted and merged where they overlap or touch. */
export function mergeRanges(ranges: readonly OffsetRange[]): OffsetRange[] {
  const sorted = [...ranges].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  const merged: [bigint, bigint][] = [];
  for (const [lo, hi] of sorted) {
    const last = merged[merged.length - 1];
    if (last && lo <= last[1] + 1n) {
      if (hi > last[1]) last[1] = hi;
    } else merged.push([lo, hi]);
  }
  return merged;
}

/**
 * Per partition of `records`, the ranges a call of `addLoggedViews` covers: those of `covered`, or
 * by default the runs of consecutive offsets among the records. Throws a RangeError for a record
 * placed outside non-negative integers (the time: a safe one) or outside its partition's ranges,
 * and for a range that is not one.
 */
export function coveredRanges(
  records: readonly LoggedViews[],
  covered?: ReadonlyMap<number, readonly OffsetRange[]>,
): Map<number, OffsetRange[]> {
  const offsets = new Map<number, bigint[]>();
  for (const { partition, offset, timestamp } of records) {
    if (
      !Number.isSafeInteger(partition) ||
      partition < 0 ||
      offset < 0n ||
      !Number.isSafeInteger(timestamp) ||
      timestamp < 0
    ) {
      throw new RangeError(`invalid place in the views log: ${partition}:${offset} at ${timestamp}`);
    }
    const list = offsets.get(partition);
    if (list) list.push(offset);
    else offsets.set(partition, [offset]);
  }
  const out = new Map<number, OffsetRange[]>();
  for (const [partition, list] of offsets) {
    const given = covered?.get(partition);
    if (!given) {
      out.set(partition, offsetRuns(list));
      continue;
    }
    for (const [lo, hi] of given) {
      if (lo < 0n || hi < lo) throw new RangeError(`invalid range of the views log: ${lo}-${hi}`);
    }
    const ranges = mergeRanges(given);
    const outside = list.find((offset) => !inRanges(ranges, offset));
    if (outside !== undefined) {
      throw new RangeError(`record ${partition}:${outside} is outside the ranges its call covers`);
    }
    out.set(partition, ranges);
  }
  return out;
}
