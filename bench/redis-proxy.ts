/**
 * A TCP proxy on loopback between a server and Redis that records what crosses it: every chunk the
 * client writes (with the commands completed in it, parsed from RESP) and every chunk Redis answers.
 *
 * Round trips are counted per connection as client→server bursts that follow an answer (or open the
 * connection's record): a pipeline of N commands sent in one write is one round trip; a command sent
 * only after an earlier reply arrived is another. This holds for one request on an otherwise idle
 * server, which is how the benchmark uses it.
 */
import { connect, createServer, type Server, type Socket } from 'node:net';

export interface ProxyChunk {
  at: number;
  conn: number;
  dir: 'c2s' | 's2c';
  bytes: number;
  /** Command names completed in this client chunk (upper case). */
  commands: string[];
}

export interface TrafficSummary {
  commands: number;
  byName: Record<string, number>;
  /** Client writes (socket chunks). */
  writes: number;
  roundTrips: number;
}

/** Parses complete RESP requests (arrays of bulk strings, or inline commands) off the front of `buf`. */
export function parseCommands(buf: Buffer): { names: string[]; rest: Buffer } {
  const names: string[] = [];
  let pos = 0;
  outer: while (pos < buf.length) {
    const eol = buf.indexOf('\r\n', pos, 'latin1');
    if (eol < 0) break;
    if (buf[pos] !== 0x2a) {
      names.push((buf.toString('latin1', pos, eol).trim().split(/\s+/)[0] ?? '').toUpperCase());
      pos = eol + 2;
      continue;
    }
    const n = Number(buf.toString('latin1', pos + 1, eol));
    let p = eol + 2;
    let name = '';
    for (let i = 0; i < n; i++) {
      const e = buf.indexOf('\r\n', p, 'latin1');
      if (e < 0) break outer;
      const len = Number(buf.toString('latin1', p + 1, e));
      const start = e + 2;
      const end = start + len;
      if (end + 2 > buf.length) break outer;
      if (i === 0) name = buf.toString('latin1', start, end).toUpperCase();
      p = end + 2;
    }
    names.push(name);
    pos = p;
  }
  return { names, rest: buf.subarray(pos) };
}

export function summarize(chunks: readonly ProxyChunk[]): TrafficSummary {
  const byName: Record<string, number> = {};
  let commands = 0;
  let writes = 0;
  let roundTrips = 0;
  const lastDir = new Map<number, 'c2s' | 's2c'>();
  for (const c of chunks) {
    if (c.dir === 'c2s') {
      writes++;
      if (lastDir.get(c.conn) !== 'c2s') roundTrips++;
      for (const name of c.commands) {
        commands++;
        byName[name] = (byName[name] ?? 0) + 1;
      }
    }
    lastDir.set(c.conn, c.dir);
  }
  return { commands, byName, writes, roundTrips };
}

export class RedisCountingProxy {
  private readonly chunks: ProxyChunk[] = [];
  private readonly sockets = new Set<Socket>();
  private nextConn = 0;
  recording = false;

  private constructor(
    private readonly server: Server,
    readonly port: number,
  ) {}

  static async start(upstream: URL): Promise<RedisCountingProxy> {
    const ref: { proxy?: RedisCountingProxy } = {};
    const server = createServer((client) => ref.proxy?.accept(client, upstream));
    await new Promise<void>((ok) => server.listen(0, '127.0.0.1', ok));
    ref.proxy = new RedisCountingProxy(server, (server.address() as { port: number }).port);
    return ref.proxy;
  }

  /** The Redis URL to give the server: the upstream's credentials and database, our port. */
  urlFor(upstream: URL): string {
    const url = new URL(upstream.toString());
    url.hostname = '127.0.0.1';
    url.port = String(this.port);
    return url.toString();
  }

  /** Starts a fresh record. */
  record(): void {
    this.chunks.length = 0;
    this.recording = true;
  }

  /** Chunks recorded since `record()` with `at` (performance.now()) in [from, to). */
  between(from: number, to: number): ProxyChunk[] {
    return this.chunks.filter((c) => c.at >= from && c.at < to);
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((ok) => this.server.close(() => ok()));
  }

  private accept(client: Socket, upstream: URL): void {
    const conn = this.nextConn++;
    const server = connect(Number(upstream.port || 6379), upstream.hostname);
    client.setNoDelay(true);
    server.setNoDelay(true);
    this.sockets.add(client).add(server);
    let pending: Buffer = Buffer.alloc(0);
    client.on('data', (data: Buffer) => {
      pending = pending.length === 0 ? data : Buffer.concat([pending, data]);
      const { names, rest } = parseCommands(pending);
      pending = Buffer.from(rest);
      if (this.recording)
        this.chunks.push({ at: performance.now(), conn, dir: 'c2s', bytes: data.length, commands: names });
      server.write(data);
    });
    server.on('data', (data: Buffer) => {
      if (this.recording)
        this.chunks.push({ at: performance.now(), conn, dir: 's2c', bytes: data.length, commands: [] });
      client.write(data);
    });
    const end = (): void => {
      client.destroy();
      server.destroy();
      this.sockets.delete(client);
      this.sockets.delete(server);
    };
    client.on('close', end).on('error', end);
    server.on('close', end).on('error', end);
  }
}
