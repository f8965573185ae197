/**
 * For a line every request would write while a dependency is out (a few thousand a second): the
 * first goes at once, then at most one per `intervalMs`, each told how many were held back since
 * the one before (`write(held)`), so the log still shows when it started, that it went on, and how
 * much. A process keeps one per kind of line.
 */
export function damped(
  intervalMs = 1_000,
  now: () => number = () => performance.now(),
): (write: (held: number) => void) => void {
  let nextAt = Number.NEGATIVE_INFINITY;
  let held = 0;
  return (write) => {
    const at = now();
    if (at < nextAt) {
      held++;
      return;
    }
    nextAt = at + intervalMs;
    const before = held;
    held = 0;
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
