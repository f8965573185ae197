/**
 * For a line every request would write while a dependency is out (a few thousand a second): the
 * first goes at once, then at most one per `intervalMs`, each told how many were held back since
 * the one before (`write(held)`), so the log still shows when it started, that it went on, and how
 * much. Lines held back when the flood stops are not forgotten: the last of them is written when
 * its interval ends, told how many others were held with it. A process keeps one per kind of line.
 */
export function damped(
  intervalMs = 1_000,
  now: () => number = () => performance.now(),
): (write: (held: number) => void) => void {
  let nextAt = Number.NEGATIVE_INFINITY;
  let held = 0;
  // The last line held back, written at the end of its interval if no line comes after it.
  let last: ((held: number) => void) | undefined;
  let timer: NodeJS.Timeout | undefined;
  const writeLast = () => {
    timer = undefined;
    const write = last;
    if (!write || held === 0) return;
    const at = now();
    // A line came after it and began another interval: its own last is due at that one's end.
    if (at < nextAt) {
      timer = setTimeout(writeLast, nextAt - at).unref();
      return;
    }
    last = undefined;
    const before = held - 1;
    held = 0;
    nextAt = at + intervalMs;
    write(before);
  };
  return (write) => {
    const at = now();
    if (at < nextAt) {
      held++;
      last = write;
      timer ??= setTimeout(writeLast, Math.max(0, nextAt - at)).unref();
      return;
    }
    nextAt = at + intervalMs;
    const before = held;
    held = 0;
    last = undefined;
    write(before);
  };
}

/** Kinds of line damped apart, at most; a new kind past them starts the table again. */
const KINDS_KEPT = 256;

/**
 * `damped` per kind (an error's code, say): one kind flooding the log does not hold back the first
 * line of another.
 */
export function dampedByKind(
  intervalMs = 1_000,
  now: () => number = () => performance.now(),
): (kind: string, write: (held: number) => void) => void {
  const kinds = new Map<string, (write: (held: number) => void) => void>();
  return (kind, write) => {
    let damper = kinds.get(kind);
    if (!damper) {
      if (kinds.size >= KINDS_KEPT) kinds.clear();
      damper = damped(intervalMs, now);
      kinds.set(kind, damper);
    }
    damper(write);
  };
}
