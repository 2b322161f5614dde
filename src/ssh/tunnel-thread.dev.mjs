// The tunnel thread's entry when backhaul runs from its TypeScript sources (tests, benchmarks): tsx
// compiles the thread's modules, as it does the main thread's. The built package uses
// dist/ssh/tunnel-thread.js directly; this file is not part of it.
import { register } from 'tsx/esm/api';

register();
await import('./tunnel-thread.ts');
