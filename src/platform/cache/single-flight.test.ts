import { describe, expect, it } from 'vitest';
import { SingleFlight } from './single-flight.js';

function deferred<T>() {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((ok, fail) => {
    resolve = ok;
    reject = fail;
  });
  return { promise, resolve, reject };
}

describe(SingleFlight.name, () => {
  it('runs one load for concurrent callers of a key and none once it settled', async () => {
    const sut = new SingleFlight<string>();
    let calls = 0;
    const gate = deferred<string>();
    const load = () => {
      calls++;
      return gate.promise;
    };
    const both = Promise.all([sut.do('k', load), sut.do('k', load)]);
    expect(sut.size).toBe(1);
    gate.resolve('v');
    expect(await both).toEqual(['v', 'v']);
    expect(calls).toBe(1);
    expect(sut.size).toBe(0);
    await sut.do('k', async () => {
      calls++;
      return 'w';
    });
    expect(calls).toBe(2);
  });

  it('hands a failure to every caller that joined and lets the next caller retry', async () => {
    const sut = new SingleFlight<string>();
    const gate = deferred<string>();
    const first = sut.do('k', () => gate.promise);
    const second = sut.do('k', async () => 'unused');
    gate.reject(new Error('down'));
    await expect(first).rejects.toThrow('down');
    await expect(second).rejects.toThrow('down');
    expect(await sut.do('k', async () => 'up')).toBe('up');
  });

  it('keeps keys apart', async () => {
    const sut = new SingleFlight<string>();
    const [a, b] = await Promise.all([sut.do('a', async () => 'A'), sut.do('b', async () => 'B')]);
    expect([a, b]).toEqual(['A', 'B']);
  });

  it('after forget, later callers start a new load while earlier ones keep theirs', async () => {
    const sut = new SingleFlight<string>();
    const gate = deferred<string>();
    const early = sut.do('k', () => gate.promise);
    sut.forget('k');
    const late = sut.do('k', async () => 'fresh');
    gate.resolve('old');
    expect(await early).toBe('old');
    expect(await late).toBe('fresh');
  });

  it('loads the keys not in flight in one batch and joins the others', async () => {
    const sut = new SingleFlight<number>();
    const gate = deferred<number>();
    const running = sut.do('a', () => gate.promise);
    const batches: string[][] = [];
    const many = sut.many(['a', 'b', 'c', 'b'], async (keys) => {
      batches.push([...keys]);
      return new Map([['b', 2]]);
    });
    // A caller arriving while the batch runs joins it instead of loading again.
    const joined = sut.many(['c'], async () => {
      batches.push(['again']);
      return new Map();
    });
    gate.resolve(1);
    expect(await running).toBe(1);
    expect(await many).toEqual(
      new Map([
        ['a', 1],
        ['b', 2],
      ]),
    );
    expect(await joined).toEqual(new Map());
    expect(batches).toEqual([['b', 'c']]);
    expect(sut.size).toBe(0);
  });
});
