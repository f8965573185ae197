/** Bounds of an exponential back-off, in ms. */
export interface Backoff {
  min: number;
  max: number;
}

/** The wait after `failures` failures in a row (0 for the first): `min` doubled each time, at most `max`. */
export function backoffMs(backoff: Backoff, failures: number): number {
  return Math.min(backoff.max, backoff.min * 2 ** Math.min(failures, 16));
}
