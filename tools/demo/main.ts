/**
 * `npm run demo` (node --import tsx tools/demo/main.ts [flags]): the whole flow on this machine, as
 * `backhaul demo`. The demo and the loopback site it runs on live in tools/, outside the package: they
 * create users, start sshds and Slurm, and install Debian packages, which no fleet member should carry.
 */
import { main } from '../../src/cli/main.js';
import { registerDemo } from './command.js';

process.exitCode = await main(['demo', ...process.argv.slice(2)], [registerDemo]);
