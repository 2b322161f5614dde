import { removeStalePipeDirs } from '../src/ssh/hop-pipes.js';

/**
 * After the whole suite: the fault tests kill session hosts with SIGKILL, which leaves their pipe dirs in
 * /tmp (a session host that starts later removes them; after the last test none does).
 */
export async function teardown(): Promise<void> {
  const removed = await removeStalePipeDirs();
  if (removed.length > 0) console.log(`removed ${removed.length} pipe dir(s) of session hosts killed by the tests`);
}
