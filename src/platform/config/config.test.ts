import { createPrivateKey, generateKeyPairSync } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig, unknownSettings } from './config.js';

const rsaPem = (bits: number): string =>
  generateKeyPairSync('rsa', { modulusLength: bits })
    .privateKey.export({ type: 'pkcs8', format: 'pem' })
    .toString();

/** The least the cluster profile starts with (nothing here is contacted). */
const CLUSTER_ENV = {
  ZG_PROFILE: 'cluster',
  ZG_MYSQL_URL: 'mysql://root@127.0.0.1:3306/zhiguang',
  ZG_REDIS_URL: 'redis://127.0.0.1:6379',
  ZG_KAFKA_BROKERS: '127.0.0.1:9092',
  ZG_S3_BUCKET: 'zhiguang',
  ZG_S3_ACCESS_KEY_ID: 'key',
  ZG_S3_SECRET_ACCESS_KEY: 'secret',
  ZG_SMTP_URL: 'smtp://127.0.0.1:25',
  ZG_JWT_PRIVATE_KEY: rsaPem(2048),
};

describe(loadConfig.name, () => {
  it('defaults to the embedded profile on port 8080 with ./data', () => {
    const sut = loadConfig({});
    expect(sut).toMatchObject({
      profile: 'embedded',
      role: 'all',
      port: 8080,
      dataDir: './data',
      publicUrl: 'http://localhost:8080',
    });
    expect(sut.jwt.accessTtlSeconds).toBe(900);
    expect(sut.jwt.refreshTtlSeconds).toBe(604_800);
  });

  it('lists every problem at once instead of falling back', () => {
    let error: unknown;
    try {
      loadConfig({
        ZG_PROFILE: 'cluster',
        PORT: 'eighty',
        ZG_KAFKA_BROKERS: 'nohost',
        ZG_REDIS_PREFIX: 'zg{a}:',
      });
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(ConfigError);
    const problems = (error as ConfigError).problems.join('\n');
    for (const name of [
      'PORT',
      'ZG_MYSQL_URL',
      'ZG_REDIS_URL',
      'ZG_KAFKA_BROKERS',
      'ZG_JWT_PRIVATE_KEY',
      'ZG_SMTP_URL',
      'ZG_REDIS_PREFIX',
    ]) {
      expect(problems).toContain(name);
    }
  });

  it('takes whole numbers written in decimal digits only', () => {
    for (const written of ['0x1F90', '8e3', '8080.0', '+8080', '1_000', '-0x1']) {
      expect(() => loadConfig({ PORT: written })).toThrow(/PORT: must be an integer/);
    }
    expect(loadConfig({ PORT: ' 8081 ' }).port).toBe(8081);
    // Blank is unset: the default.
    expect(loadConfig({ PORT: ' ' }).port).toBe(8080);
    expect(loadConfig({ ZG_AVATAR_MAX_BYTES: '5000000' }).avatarMaxBytes).toBe(5_000_000);
  });

  it('trusts no proxy unless told which', () => {
    expect(loadConfig({}).trustProxy).toBe(false);
    expect(loadConfig({ ZG_TRUST_PROXY: 'true' }).trustProxy).toBe(true);
    expect(loadConfig({ ZG_TRUST_PROXY: '2' }).trustProxy).toBe(2);
    expect(loadConfig({ ZG_TRUST_PROXY: ' 10.0.0.0/8, loopback,::1 ' }).trustProxy).toBe(
      '10.0.0.0/8,loopback,::1',
    );
    expect(loadConfig({ ZG_TRUST_PROXY: '0' }).trustProxy).toBe(false);
    for (const bad of ['17', 'proxy.local', '10.0.0.0/33', '10.0.0.1/8/1', 'yes']) {
      expect(() => loadConfig({ ZG_TRUST_PROXY: bad }), bad).toThrow(/ZG_TRUST_PROXY/);
    }
  });

  it('takes an RSA signing key of 2048 bits or more only, in PKCS#8 or PKCS#1', () => {
    const pkcs1 = createPrivateKey(CLUSTER_ENV.ZG_JWT_PRIVATE_KEY)
      .export({ type: 'pkcs1', format: 'pem' })
      .toString();
    expect(loadConfig({ ...CLUSTER_ENV, ZG_JWT_PRIVATE_KEY: pkcs1 }).jwt.privateKeyPem).toBe(pkcs1.trim());
    // A key in one line with its line breaks written as \n, as some secret stores hand it out.
    const oneLine = CLUSTER_ENV.ZG_JWT_PRIVATE_KEY.replace(/\n/g, '\\n');
    expect(loadConfig({ ...CLUSTER_ENV, ZG_JWT_PRIVATE_KEY: oneLine }).jwt.privateKeyPem).toBe(
      CLUSTER_ENV.ZG_JWT_PRIVATE_KEY,
    );
    const ec = generateKeyPairSync('ec', { namedCurve: 'P-256' })
      .privateKey.export({ type: 'pkcs8', format: 'pem' })
      .toString();
    for (const [bad, why] of [
      ['-----BEGIN PRIVATE KEY-----\\n…\\n-----END PRIVATE KEY-----', /PEM-encoded/],
      [ec, /RSA key \(got ec\)/],
      [rsaPem(1024), /at least 2048 bits.*1024/],
    ] as const) {
      expect(() => loadConfig({ ...CLUSTER_ENV, ZG_JWT_PRIVATE_KEY: bad })).toThrow(why);
    }
  });

  it('takes keys to accept besides the signing key, public or private, one after another', () => {
    const next = generateKeyPairSync('rsa', { modulusLength: 2048 })
      .publicKey.export({ type: 'spki', format: 'pem' })
      .toString();
    const previous = rsaPem(2048);
    expect(loadConfig(CLUSTER_ENV).jwt.acceptedKeyPems).toEqual([]);
    expect(
      loadConfig({ ...CLUSTER_ENV, ZG_JWT_ACCEPTED_KEYS: `${next}\n${previous}` }).jwt.acceptedKeyPems,
    ).toEqual([next.trim(), previous.trim()]);
    const oneLine = `${next}${previous}`.replace(/\n/g, '\\n');
    expect(loadConfig({ ...CLUSTER_ENV, ZG_JWT_ACCEPTED_KEYS: oneLine }).jwt.acceptedKeyPems).toHaveLength(2);
    const ec = generateKeyPairSync('ec', { namedCurve: 'P-256' })
      .publicKey.export({ type: 'spki', format: 'pem' })
      .toString();
    for (const [bad, why] of [
      ['not a key', /one or more PEM-encoded RSA keys/],
      [`${next}${ec}`, /key 2.*RSA key \(got ec\)/],
      ['-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----', /key 1.*PEM-encoded/],
      // A second key cut short, and words around a key.
      [`${next}${previous.slice(0, 300)}`, /outside the PEM blocks/],
      [`old: ${next}`, /outside the PEM blocks/],
    ] as const) {
      expect(() => loadConfig({ ...CLUSTER_ENV, ZG_JWT_ACCEPTED_KEYS: bad }), bad).toThrow(why);
    }
  });

  it('refuses a Kafka prefix that Kafka would refuse in a topic name', () => {
    expect(loadConfig({ ...CLUSTER_ENV, ZG_KAFKA_PREFIX: 'prod-1_zg.' }).kafkaPrefix).toBe('prod-1_zg.');
    for (const bad of ['zg:prod/', 'zg prod', 'x'.repeat(181)]) {
      expect(() => loadConfig({ ...CLUSTER_ENV, ZG_KAFKA_PREFIX: bad }), bad).toThrow(/ZG_KAFKA_PREFIX/);
    }
  });

  it('takes a public URL that paths can be appended to', () => {
    expect(loadConfig({ ZG_PUBLIC_URL: 'https://zhiguang.example/api/' }).publicUrl).toBe(
      'https://zhiguang.example/api',
    );
    for (const bad of ['https://a.example/?x=1', 'https://a.example/#top', 'https://me:pw@a.example']) {
      expect(() => loadConfig({ ZG_PUBLIC_URL: bad }), bad).toThrow(/ZG_PUBLIC_URL/);
    }
  });

  it('lets pages of any origin call the API unless given a list of origins', () => {
    expect(loadConfig({}).corsOrigins).toBe(true);
    expect(loadConfig({ ZG_CORS_ORIGINS: ' * ' }).corsOrigins).toBe(true);
    expect(
      loadConfig({ ZG_CORS_ORIGINS: 'https://zhiguang.example, http://localhost:5173' }).corsOrigins,
    ).toEqual(['https://zhiguang.example', 'http://localhost:5173']);
    for (const bad of [
      'zhiguang.example',
      'https://zhiguang.example/',
      'https://a.example,*',
      'ftp://a.example',
    ]) {
      expect(() => loadConfig({ ZG_CORS_ORIGINS: bad }), bad).toThrow(/ZG_CORS_ORIGINS/);
    }
  });

  it('logs phone codes on embedded only, unless a webhook is set or told otherwise', () => {
    expect(loadConfig({}).sms).toEqual({ webhookUrl: undefined, webhookToken: undefined, log: true });
    expect(loadConfig(CLUSTER_ENV).sms.log).toBe(false);
    expect(loadConfig({ ...CLUSTER_ENV, ZG_SMS_LOG_CODES: 'true' }).sms.log).toBe(true);
    expect(loadConfig({ ZG_SMS_LOG_CODES: 'false' }).sms.log).toBe(false);
    expect(
      loadConfig({
        ...CLUSTER_ENV,
        ZG_SMS_WEBHOOK_URL: 'https://sms.example/send',
        ZG_SMS_WEBHOOK_TOKEN: 't',
      }).sms,
    ).toEqual({ webhookUrl: 'https://sms.example/send', webhookToken: 't', log: false });
    expect(() => loadConfig({ ZG_SMS_WEBHOOK_URL: 'ftp://sms.example' })).toThrow(/ZG_SMS_WEBHOOK_URL/);
    expect(() => loadConfig({ ZG_SMS_LOG_CODES: 'yes' })).toThrow(/ZG_SMS_LOG_CODES/);
  });

  it('logs e-mail codes without a mail server on embedded, and on cluster only when told to', () => {
    expect(loadConfig({}).smtp).toMatchObject({ url: undefined, log: true });
    expect(loadConfig(CLUSTER_ENV).smtp).toMatchObject({ url: 'smtp://127.0.0.1:25', log: false });
    const { ZG_SMTP_URL: _url, ...noMail } = CLUSTER_ENV;
    expect(() => loadConfig(noMail)).toThrow(
      /ZG_SMTP_URL: required on the cluster profile.*ZG_MAIL_LOG_CODES/,
    );
    expect(loadConfig({ ...noMail, ZG_MAIL_LOG_CODES: 'true' }).smtp).toMatchObject({
      url: undefined,
      log: true,
    });
    // A mail server, when set, is used whatever the setting says.
    expect(loadConfig({ ...CLUSTER_ENV, ZG_MAIL_LOG_CODES: 'true' }).smtp.url).toBe('smtp://127.0.0.1:25');
    expect(() => loadConfig({ ZG_MAIL_LOG_CODES: 'false' })).toThrow(/ZG_SMTP_URL/);
    expect(() => loadConfig({ ZG_MAIL_LOG_CODES: 'yes' })).toThrow(/ZG_MAIL_LOG_CODES/);
    // Plaintext only when asked for in so many words; nothing else in the query (a typo would be ignored).
    const optional = 'smtp://u:p@mail.example:587?tls=optional';
    expect(loadConfig({ ZG_SMTP_URL: optional }).smtp.url).toBe(optional);
    for (const query of ['?tls=off', '?tls=optional&x=1', '?requireTLS=false'])
      expect(() => loadConfig({ ZG_SMTP_URL: `smtp://mail.example${query}` })).toThrow(
        /ZG_SMTP_URL: the only query it takes is \?tls=optional/,
      );
  });

  it('refuses an unknown profile rather than starting embedded', () => {
    expect(() => loadConfig({ ZG_PROFILE: 'clustre' })).toThrow(/ZG_PROFILE/);
  });

  it("refuses a cluster's settings with no profile rather than starting embedded", () => {
    const { ZG_PROFILE: _profile, ...withoutProfile } = CLUSTER_ENV;
    expect(() => loadConfig(withoutProfile)).toThrow(
      /ZG_PROFILE: not set, so embedded, which does not use ZG_MYSQL_URL, ZG_REDIS_URL, ZG_KAFKA_BROKERS, .*set ZG_PROFILE=cluster/,
    );
    expect(() => loadConfig({ ZG_S3_BUCKET: 'zhiguang' })).toThrow(/does not use ZG_S3_BUCKET:/);
    // Named embedded, they are ignored as asked.
    expect(loadConfig({ ...withoutProfile, ZG_PROFILE: 'embedded' }).profile).toBe('embedded');
    expect(loadConfig({}).profile).toBe('embedded');
  });

  it('lets --role win over ZG_ROLE and validates it', () => {
    const cluster = { ...CLUSTER_ENV, ZG_ROLE: 'api' };
    expect(loadConfig(cluster, { role: 'worker' }).role).toBe('worker');
    expect(() => loadConfig({}, { role: 'boss' })).toThrow(/ZG_ROLE/);
  });

  it('drains 5 s by default where an API is served on the cluster profile, not on a worker or embedded', () => {
    const drain = (env: Record<string, string>, role?: string) =>
      loadConfig(env, role === undefined ? {} : { role }).shutdownDrainMs;
    expect([
      drain(CLUSTER_ENV, 'api'),
      drain(CLUSTER_ENV, 'all'),
      drain(CLUSTER_ENV, 'worker'),
      drain({}),
    ]).toEqual([5_000, 5_000, 0, 0]);
    expect(drain({ ...CLUSTER_ENV, ZG_SHUTDOWN_DRAIN_MS: '2000' }, 'worker')).toBe(2_000);
  });

  it('runs the embedded profile only as one process of every role', () => {
    expect(loadConfig({}).role).toBe('all');
    for (const role of ['api', 'worker']) {
      expect(() => loadConfig({ ZG_ROLE: role }), role).toThrow(/ZG_ROLE: the embedded profile/);
    }
  });

  it('reads secrets from <VAR>_FILE', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'zg-config-'));
    try {
      writeFileSync(join(dir, 'redis'), 'redis://secret@127.0.0.1:6379\n');
      expect(loadConfig({ ZG_PROFILE: 'embedded', ZG_REDIS_URL_FILE: join(dir, 'redis') }).redisUrl).toBe(
        'redis://secret@127.0.0.1:6379',
      );
      expect(() => loadConfig({ ZG_REDIS_URL_FILE: join(dir, 'missing') })).toThrow(/ZG_REDIS_URL_FILE/);
      // An empty secret is refused, not taken as "no token".
      writeFileSync(join(dir, 'token'), '\n');
      expect(() => loadConfig({ ZG_METRICS_TOKEN_FILE: join(dir, 'token') })).toThrow(
        /ZG_METRICS_TOKEN_FILE: .* is empty/,
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
  it('requires the bucket settings on the cluster profile and bounds the node id', () => {
    const problems = (env: NodeJS.ProcessEnv): string => {
      try {
        loadConfig(env);
        return '';
      } catch (err) {
        return (err as ConfigError).problems.join('\n');
      }
    };
    const cluster = problems({ ZG_PROFILE: 'cluster' });
    for (const name of ['ZG_S3_BUCKET', 'ZG_S3_ACCESS_KEY_ID', 'ZG_S3_SECRET_ACCESS_KEY']) {
      expect(cluster).toContain(name);
    }
    expect(problems({ ZG_NODE_ID: '1024' })).toContain('ZG_NODE_ID');
    expect(problems({ ZG_S3_BUCKET: 'Not_A_Bucket' })).toContain('ZG_S3_BUCKET');
    const sut = loadConfig({ ZG_NODE_ID: '1023', ZG_S3_FORCE_PATH_STYLE: 'true' });
    expect(sut.nodeId).toBe(1023);
    expect(sut.s3.forcePathStyle).toBe(true);
    expect(sut.posts).toEqual({
      contentMaxBytes: 5 * 1024 * 1024,
      imageMaxBytes: 10 * 1024 * 1024,
      presignExpiresSeconds: 600,
      uploadRetentionMs: 24 * 3_600_000,
    });
    expect(loadConfig({ ZG_UPLOAD_RETENTION_HOURS: '1' }).posts.uploadRetentionMs).toBe(3_600_000);
    expect(() => loadConfig({ ZG_UPLOAD_RETENTION_HOURS: '0' })).toThrow(/ZG_UPLOAD_RETENTION_HOURS/);
  });
});

describe(unknownSettings.name, () => {
  it('names the ZG_ variables no setting reads, a secret given as a file included', () => {
    expect(
      unknownSettings({
        ZG_NODEID: '3',
        ZG_NODE_ID: '3',
        ZG_JWT_PRIVATE_KEY_FILE: '/run/key.pem',
        ZG_COUNTER_FLUSH_INTERVAL_MS: '500',
        ZG_SMTP_URL_FIL: 'x',
        ZG_KAFKA_PORT: '19092',
        ZG_TEST_REDIS_URL: 'redis://127.0.0.1',
        PATH: '/bin',
      }),
    ).toEqual(['ZG_COUNTER_FLUSH_INTERVAL_MS', 'ZG_NODEID', 'ZG_SMTP_URL_FIL']);
  });
});
