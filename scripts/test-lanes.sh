#!/bin/sh
# `npm test` after the build: the files that must run alone, then the two lanes side by side, each its
# own vitest run (test/lanes.ts says why; vitest itself runs a project's files in one pool, so two
# sequential lanes need two runs). Lane B's lines are prefixed with "b| ". Every run runs, whatever the
# one before did; the exit status is the first failure's.
set -u
cd "$(dirname "$0")/.."
vitest=node_modules/.bin/vitest

"$vitest" run --project alone
alone=$?

"$vitest" run --project lane-a &
a_pid=$!
# The pipe would hide vitest's status: it goes through a file.
status_file=$(mktemp)
{ "$vitest" run --project lane-b; echo $? >"$status_file"; } 2>&1 | sed -u 's/^/b| /'
wait "$a_pid"
lane_a=$?
lane_b=$(cat "$status_file")
rm -f "$status_file"

echo "test lanes: alone exit $alone, lane-a exit $lane_a, lane-b exit $lane_b"
for status in "$alone" "$lane_a" "$lane_b"; do
  [ "$status" -eq 0 ] || exit "$status"
done
exit 0
