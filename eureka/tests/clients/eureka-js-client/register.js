// Drives the unmodified npm `eureka-js-client` against a Eureka server, for
// eureka/tests/eureka_real_clients.rs: serves HTTP on a free port, registers it, heartbeats,
// and obeys commands on stdin, one per line:
//   out_of_service  PUT .../status?value=OUT_OF_SERVICE (an operator's action: the library has no call for it)
//   in_service      DELETE .../status (removes the override)
//   stop            client.stop(): deregisters, then exits 0
// Reports on stdout as lines starting with "odmesh-driver: ".
// Environment: EUREKA_HOST, EUREKA_PORT, APP, INSTANCE_ID, VIP, HEARTBEAT_MS, LEASE_SECS.
'use strict';

const http = require('http');
const readline = require('readline');
const { Eureka } = require('eureka-js-client');

const env = (name, fallback) => process.env[name] || fallback;
const say = (line) => process.stdout.write(`odmesh-driver: ${line}\n`);

const eurekaHost = env('EUREKA_HOST', '127.0.0.1');
const eurekaPort = Number(env('EUREKA_PORT', '8761'));
const app = env('APP', 'jsdemo');
const instanceId = env('INSTANCE_ID', 'jsdemo-1');
const vip = env('VIP', app);
const heartbeatMs = Number(env('HEARTBEAT_MS', '1000'));
const leaseSecs = Number(env('LEASE_SECS', '3'));

const server = http.createServer((req, res) => {
  res.writeHead(200, { 'content-type': 'text/plain' });
  res.end(`hello from ${instanceId}\n`);
});

server.listen(0, '127.0.0.1', () => {
  const port = server.address().port;
  say(`listening ${port}`);
  const client = new Eureka({
    logger: { debug() {}, info() {}, warn() {}, error: (...a) => console.error('error', ...a) },
    shouldUseDelta: true,
    instance: {
      app,
      instanceId,
      hostName: 'localhost',
      ipAddr: '127.0.0.1',
      statusPageUrl: `http://127.0.0.1:${port}/`,
      port: { $: port, '@enabled': true },
      vipAddress: vip,
      dataCenterInfo: { '@class': 'com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo', name: 'MyOwn' },
      leaseInfo: { renewalIntervalInSecs: Math.max(1, Math.round(heartbeatMs / 1000)), durationInSecs: leaseSecs },
      status: 'UP',
    },
    eureka: {
      host: eurekaHost,
      port: eurekaPort,
      servicePath: '/eureka/apps/',
      heartbeatInterval: heartbeatMs,
      registryFetchInterval: heartbeatMs,
      maxRetries: 1,
      requestRetryDelay: 100,
    },
  });
  client.on('registered', () => say('registered'));
  client.on('heartbeat', () => say('heartbeat'));
  // Its cache changes on full fetches and on deltas (which emit no event): report the UP
  // instances it holds for the VIP when that changes. (It filters non-UP instances on full
  // fetches only; a MODIFIED delta keeps them, with their new status.)
  let discovered = -1;
  setInterval(() => {
    const n = client.getInstancesByVipAddress(vip).filter((i) => i.status === 'UP').length;
    if (n !== discovered) {
      discovered = n;
      say(`discovered ${n}`);
    }
  }, 100);
  client.on('deregistered', () => say('deregistered'));
  client.start((err) => {
    if (err) {
      say(`start failed: ${err}`);
      process.exit(1);
    }
    say('started');
  });

  const statusPath = `/eureka/apps/${app.toUpperCase()}/${encodeURIComponent(instanceId)}/status`;
  const operator = (method, path) => {
    const req = http.request({ host: eurekaHost, port: eurekaPort, method, path }, (res) => {
      res.resume();
      say(`${method} status ${res.statusCode}`);
    });
    req.on('error', (e) => say(`${method} status failed: ${e}`));
    req.end();
  };

  readline.createInterface({ input: process.stdin }).on('line', (line) => {
    switch (line.trim()) {
      case 'out_of_service':
        operator('PUT', `${statusPath}?value=OUT_OF_SERVICE`);
        break;
      case 'in_service':
        operator('DELETE', statusPath);
        break;
      case 'stop':
        client.stop(() => {
          say('stopped');
          server.close();
          process.exit(0);
        });
        break;
      default:
        say(`unknown command ${line}`);
    }
  });
});
