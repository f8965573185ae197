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
