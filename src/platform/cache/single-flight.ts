/**
 * Collapses concurrent loads of one key into one: while a load of a key is in flight, later callers
 * get its promise instead of starting another. Nothing is kept once the load settles (a failure
 * reaches every caller that joined it, and the next caller starts afresh).
 *
 * `forget` detaches the load in flight for a key: callers already waiting still get its result, but
 * callers that come later start a new load. Caches call it when the key's data changes, so a reader
 * that arrives after a change never receives a value read before it.
 */
export class SingleFlight<V> {
  private readonly flights = new Map<string, Promise<V | undefined>>();

  get size(): number {
    return this.flights.size;
  }

  /** Undefined stands for "nothing found" and is shared like any value. */
  do(key: string, load: () => Promise<V | undefined>): Promise<V | undefined> {
    const pending = this.flights.get(key);
    if (pending) return pending;
    const flight = (async () => load())().finally(() => {
      if (this.flights.get(key) === flight) this.flights.delete(key);
    });
    this.flights.set(key, flight);
    return flight;
  }

  /**
   * One load for every key without a flight, shared by each of those keys; keys already in flight
   * join theirs. The result holds the keys whose flights produced a value.
   */
  async many(
    keys: readonly string[],
    load: (keys: readonly string[]) => Promise<Map<string, V>>,
  ): Promise<Map<string, V>> {
    const waits: [string, Promise<V | undefined>][] = [];
    const fresh: string[] = [];
    for (const key of new Set(keys)) {
      const pending = this.flights.get(key);
      if (pending) waits.push([key, pending]);
      else fresh.push(key);
    }
    if (fresh.length > 0) {
      const batch = (async () => load(fresh))();
      for (const key of fresh) {
        // Each key's flight settles with the batch: undefined when the batch had nothing for it.
        const flight: Promise<V | undefined> = batch
          .then((found) => found.get(key))
          .finally(() => {
            if (this.flights.get(key) === flight) this.flights.delete(key);
          });
        this.flights.set(key, flight);
        waits.push([key, flight]);
      }
    }
    const result = new Map<string, V>();
    const values = await Promise.all(waits.map(([, p]) => p));
    waits.forEach(([key], i) => {
      const value = values[i];
      if (value !== undefined) result.set(key, value);
    });
    return result;
  }

  forget(key: string): void {
    this.flights.delete(key);
  }
}
