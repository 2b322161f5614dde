#!/usr/bin/env node
// The compiled CLI lives in dist/ (built by `npm run build`, which `npm ci` runs through `prepare`).
import { main } from '../dist/cli/main.js';

const code = await main(process.argv.slice(2));
process.exitCode = code;
// A library handle left open must not keep a finished command alive; stdout drains first.
setTimeout(() => process.exit(code), 2_000).unref();
