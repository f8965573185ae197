import { setTimeout as sleep } from 'node:timers/promises';

/**
 * Items a verify pass could not judge yet (changes still on their way), checked again after a pause,
 * `rounds` times at most: `check` answers whether the item is settled now (and accounts for it).
 * Resolves with the items still unsettled after the last round.
 */
export async function recheckUnsettled<T>(
  items: readonly T[],
  options: { rounds: number; pauseMs: number },
  check: (item: T) => Promise<boolean>,
  onRound: (waiting: number) => void,
): Promise<T[]> {
  let waiting = [...items];
  for (let round = 0; round < options.rounds && waiting.length > 0; round++) {
    onRound(waiting.length);
    await sleep(options.pauseMs);
    const still: T[] = [];
    for (const item of waiting) if (!(await check(item))) still.push(item);
    waiting = still;
  }
  return waiting;
}
