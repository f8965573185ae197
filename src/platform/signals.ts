/**
 * One Ctrl-C may arrive twice within milliseconds: the terminal signals the whole foreground process
 * group, and npm passes the signal it got on to its script, so node gets both where the script's
 * shell runs it as a process of its own (bash does). A signal this soon after the first is that one.
 */
export const SAME_SIGNAL_MS = 1_000;

/**
 * Whether a signal now is the one of `firstAt` again (see `SAME_SIGNAL_MS`); times are
 * `performance.now()`, which a clock set back does not move.
 */
export function sameSignal(firstAt: number, now = performance.now()): boolean {
  return now - firstAt < SAME_SIGNAL_MS;
}
