import { PYTHON } from './stack.js';

/** The line the batch script prints when the workload has finished: `workload: exit <status>`. */
export const WORKLOAD_DONE = /^workload: exit (\d+)$/m;

export interface WorkloadOptions {
  /** The Service's name and port, as the pod would use them. */
  host: string;
  port: number;
  /** Bytes uploaded and then read back. */
  bytes: number;
  /** Services that share one port (two databases on 5432), each asked which one it is. */
  databases?: readonly { host: string; port: number; name: string }[];
  /** What the batch script does once the workload is done (default: stay up for the pod's lifetime). */
  after?: string;
}

/**
 * The pod's workload, after the prelude in the batch script, as the job user. It runs the way
 * Apptainer would run the pod's container: `bwrap` binds the prelude's hosts file over /etc/hosts,
 * so the Service name resolves to the pod's bind address and nothing else changes. Through the
 * tunnel it says hello, uploads BYTES of random data, reads them back and compares. Then it asks
 * each database, by name on the same port, who it is: each name has its own address. Every line it
 * prints starts with `workload:`.
 */
export function workloadScript(o: WorkloadOptions): string {
  return `echo "workload: running as $(id -un) in job $SLURM_JOB_ID on $(hostname)"
bwrap --dev-bind / / --bind "$BACKHAUL_HOSTS_FILE" /etc/hosts ${PYTHON} - <<'PYEOF'
import hashlib, http.client, os, socket, sys, time
HOST, PORT, SIZE = ${JSON.stringify(o.host)}, ${o.port}, ${o.bytes}
DATABASES = ${JSON.stringify((o.databases ?? []).map((d) => [d.host, d.port, d.name]))}
def say(text):
    print('workload: ' + text, flush=True)
say('%s resolves to %s (the hosts file bound over /etc/hosts)' % (HOST, socket.gethostbyname(HOST)))
started = time.time()
conn = http.client.HTTPConnection(HOST, PORT, timeout=60)
def call(method, path, body=None):
    conn.request(method, path, body=body)
    response = conn.getresponse()
    return response.status, response.read()
status, data = call('GET', '/')
say('GET http://%s:%d/ -> %d %s' % (HOST, PORT, status, data.decode().strip()))
body = os.urandom(SIZE)
status, data = call('PUT', '/demo/results.bin', body)
say('PUT /demo/results.bin (%d bytes) -> %d %s' % (SIZE, status, data.decode().strip()))
status, data = call('GET', '/demo/results.bin')
same = hashlib.sha256(data).digest() == hashlib.sha256(body).digest()
say('GET /demo/results.bin -> %d, %d bytes, %s' % (status, len(data), 'identical to what it sent' if same else 'NOT what it sent'))
conn.close()
say('moved %d bytes up and %d down in %.2f s' % (SIZE, len(data), time.time() - started))
answered = True
for host, port, name in DATABASES:
    with socket.create_connection((host, port), timeout=30) as db:
        db.sendall(b'SELECT current_database()\\n')
        reply = db.makefile('r').readline().strip()
    say('%s:%d (%s) -> %s' % (host, port, socket.gethostbyname(host), reply))
    answered = answered and reply == name + ': SELECT current_database()'
sys.exit(0 if same and status == 200 and answered else 1)
PYEOF
echo "workload: exit $?"
${o.after ?? 'sleep 3600'}
`;
}
