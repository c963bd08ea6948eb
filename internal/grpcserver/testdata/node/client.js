// Drives the official RocketMQ 5 Node.js client (rocketmq-client-nodejs) against flowd's gRPC
// endpoint for the Go tests of internal/grpcserver. One JSON argument says what to do; every
// result is one JSON line on stdout, the client's log goes to stderr.
'use strict';
const { Producer, SimpleConsumer, PushConsumer, ConsumeResult } = require('rocketmq-client-nodejs');
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

const spec = JSON.parse(process.argv[2]);
const out = obj => process.stdout.write(JSON.stringify(obj) + '\n');
const logger = {
  info: (...a) => spec.verbose && console.error('INFO', ...a),
  warn: (...a) => console.error('WARN', ...a),
  error: (...a) => console.error('ERROR', ...a),
  debug: () => {},
  close: () => {},
};
const sleep = ms => new Promise(r => setTimeout(r, ms));

function view(m) {
  return {
    id: m.messageId, topic: m.topic, body: m.body.toString(), tag: m.tag, keys: m.keys,
    properties: Object.fromEntries(m.properties || new Map()), messageGroup: m.messageGroup,
    attempt: m.deliveryAttempt, corrupted: m.corrupted,
  };
}

function options(m) {
  const o = { topic: spec.topic, body: Buffer.from(m.body) };
  if (m.tag) o.tag = m.tag;
  if (m.keys) o.keys = m.keys;
  if (m.properties) o.properties = new Map(Object.entries(m.properties));
  if (m.messageGroup) o.messageGroup = m.messageGroup;
  if (m.delay) o.delay = m.delay;
  return o;
}

async function produce() {
  let checked;
  const done = new Promise(r => { checked = r; });
  const producer = new Producer({
    endpoints: spec.endpoints, logger, topics: [spec.topic],
    checker: {
      async check(m) {
        out({ checked: m.messageId, body: m.body.toString() });
        checked();
        return TransactionResolution.COMMIT;
      },
    },
  });
  await producer.startup();
  out({ started: true });
  for (const m of spec.messages) {
    if (spec.transaction) {
      const tx = producer.beginTransaction();
      const r = await producer.send(options(m), tx);
      out({ messageId: r.messageId });
      if (spec.transaction === 'commit') await tx.commit();
      if (spec.transaction === 'rollback') await tx.rollback();
      // 'check': neither; the server checks back and the checker commits.
    } else {
      const r = await producer.send(options(m));
      out({ messageId: r.messageId, offset: Number(r.offset) });
    }
  }
  if (spec.transaction === 'check') {
    await done;
    await sleep(1000); // the checker's EndTransaction goes out after check returns
  }
  await producer.shutdown();
}

async function simple() {
  const consumer = new SimpleConsumer({
    endpoints: spec.endpoints, logger, consumerGroup: spec.group,
    subscriptions: new Map([[spec.topic, spec.filter || '*']]),
    awaitDuration: spec.awaitMs || 2000,
  });
  await consumer.startup();
  out({ started: true });
  const deadline = Date.now() + (spec.timeoutMs || 20000);
  let got = 0;
  while (got < spec.count && Date.now() < deadline) {
    const msgs = await consumer.receive(spec.batch || 16, spec.invisibleMs || 15000);
    for (const m of msgs) {
      got++;
      const v = view(m);
      if (spec.ack === 'none' || (spec.ackBodies && !spec.ackBodies.includes(v.body))) {
        out(v);
        continue;
      }
      if (spec.ack === 'change') {
        await consumer.changeInvisibleDuration(m, spec.changeMs);
        v.changed = true;
      } else {
        await consumer.ack(m);
        v.acked = true;
      }
      out(v);
    }
  }
  await consumer.shutdown();
}

async function push() {
  let got = 0;
  let all;
  const done = new Promise(r => { all = r; });
  const consumer = new PushConsumer({
    endpoints: spec.endpoints, logger, consumerGroup: spec.group, namespace: '',
    subscriptions: new Map([[spec.topic, spec.filter || '*']]),
    messageListener: {
      async consume(m) {
        out(view(m));
        if (++got >= spec.count) all();
        return ConsumeResult.SUCCESS;
      },
    },
  });
  await consumer.startup();
  out({ started: true });
  await Promise.race([done, sleep(spec.timeoutMs || 20000)]);
  await sleep(500); // the last acks go out
  // Its shutdown waits for the receive in flight, which long-polls for 20 s: the acks are
  // out, so the test does not wait for it.
  await Promise.race([consumer.shutdown(), sleep(1000)]);
}

const modes = { produce, simple, push };
modes[spec.mode]().then(() => process.exit(0), err => {
  console.error('FAILED', err && err.stack || err);
  out({ error: String(err && err.message || err) });
  process.exit(1);
});
