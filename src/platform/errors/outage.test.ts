import { describe, expect, it } from 'vitest';
import { isDependencyOutage } from './outage.js';

describe('isDependencyOutage', () => {
  it('knows the errors of an unreachable or overloaded service', () => {
    const outages: unknown[] = [
      Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6379'), { code: 'ECONNREFUSED' }),
      Object.assign(new Error('lost'), { code: 'PROTOCOL_CONNECTION_LOST' }),
      Object.assign(new Error('Reached the max retries per request limit'), {
        name: 'MaxRetriesPerRequestError',
      }),
      new Error('Connection is closed.'),
      // ioredis: a command past its timeout, and one refused while the connection is lost.
      new Error('Command timed out'),
      new Error("Stream isn't writeable and enableOfflineQueue options is false"),
      // ioredis: the rest of a pipeline whose first answers came before the connection reset.
      Object.assign(new Error('Command aborted due to connection close'), { name: 'AbortError' }),
      new Error('LOADING Redis is loading the dataset in memory'),
      // A replica promoted away under us, and a Redis out of memory: not now, rather than a bug.
      new Error("READONLY You can't write against a read only replica."),
      new Error("OOM command not allowed when used memory > 'maxmemory'."),
      // The same of MySQL: a primary turned read-only during a failover.
      Object.assign(
        new Error(
          'The MariaDB server is running with the --read-only option so it cannot execute this statement',
        ),
        { code: 'ER_OPTION_PREVENTS_STATEMENT', errno: 1290 },
      ),
      Object.assign(
        new Error(
          'The MySQL server is running with the --super-read-only option so it cannot execute this statement',
        ),
        { code: 'ER_OPTION_PREVENTS_STATEMENT', errno: 1290 },
      ),
      // mysql2 on a connection it lost, as a transaction's ROLLBACK then throws.
      Object.assign(new Error("Can't add new command when connection is in closed state"), { fatal: true }),
      Object.assign(new Error('Service Unavailable'), { $metadata: { httpStatusCode: 503 } }),
      // Contention that passes: a row lock held too long, a deadlock, SQLite's busy timeout.
      Object.assign(new Error('Lock wait timeout exceeded; try restarting transaction'), {
        code: 'ER_LOCK_WAIT_TIMEOUT',
        errno: 1205,
      }),
      Object.assign(new Error('Deadlock found when trying to get lock'), { code: 'ER_LOCK_DEADLOCK' }),
      Object.assign(new Error('database is locked'), { code: 'ERR_SQLITE_ERROR', errcode: 5 }),
      new Error('wrapped', { cause: new Error('Command timed out') }),
      new AggregateError([new Error('x'), Object.assign(new Error('y'), { code: 'ETIMEDOUT' })]),
    ];
    for (const err of outages)
      expect({ err: String(err), outage: isDependencyOutage(err) }).toEqual({
        err: String(err),
        outage: true,
      });
  });

  it('does not take bugs or refusals for outages', () => {
    const others: unknown[] = [
      new TypeError("Cannot read properties of undefined (reading 'x')"),
      new Error('ERR wrong number of arguments'),
      new Error('NOSCRIPT No matching script'),
      Object.assign(new Error('Duplicate entry'), { code: 'ER_DUP_ENTRY' }),
      // Another option that prevents a statement is a misconfiguration.
      Object.assign(
        new Error(
          'The MySQL server is running with the --secure-file-priv option so it cannot execute this statement',
        ),
        { code: 'ER_OPTION_PREVENTS_STATEMENT' },
      ),
      Object.assign(new Error('Forbidden'), { $metadata: { httpStatusCode: 403 } }),
      'Command timed out',
      null,
    ];
    for (const err of others)
      expect({ err: String(err), outage: isDependencyOutage(err) }).toEqual({
        err: String(err),
        outage: false,
      });
  });
});
