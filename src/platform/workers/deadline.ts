/**
 * Waits for `work` at most `ms`: true when it finished in time, false when the time ran out (the
 * work goes on, unawaited). A failure of the work rejects, as the work itself would.
 */
export async function finishedWithin(work: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), ms)));
  try {
    return await Promise.race([work.then(() => true as const), deadline]);
  } finally {
    clearTimeout(timer);
  }
}
