import { connect, createServer, type AddressInfo, type Socket } from 'node:net';

/**
 * A TCP proxy on loopback in front of `target` (a service URL) whose connections can be cut (reset)
 * or frozen: a frozen proxy keeps every connection open, accepts new ones, and forwards nothing, as
 * a host that vanished without resetting its connections.
 */
export async function tcpProxy(target: URL) {
  const sockets = new Set<Socket>();
  let frozen = false;
  const server = createServer((client) => {
    const upstream = connect(Number(target.port || 3306), target.hostname);
    for (const [a, b] of [
      [client, upstream],
      [upstream, client],
    ] as const) {
      a.on('error', () => b.destroy());
      a.on('close', () => b.destroy());
      a.on('data', (chunk: Buffer) => {
        if (!frozen) b.write(chunk);
      });
      sockets.add(a);
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = new URL(target);
  url.hostname = '127.0.0.1';
  url.port = String((server.address() as AddressInfo).port);
  return {
    /** `target` with the proxy's address in place of the service's. */
    url: url.toString(),
    cut: () => {
      for (const socket of sockets) socket.resetAndDestroy();
      sockets.clear();
    },
    freeze: () => void (frozen = true),
    /** Forwards again what arrives from now on; what arrived while frozen stays lost. */
    thaw: () => void (frozen = false),
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        sockets.clear();
        server.close(() => resolve());
      }),
  };
}
