// node_client.mjs - what the npm-client drivers of tests/test_serve.c share:
// loading a package from the folder scripts/deps.sh installs into.
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

// The package `name` under `modules` (a node_modules folder); exits 3 (the
// test skips) when it cannot be loaded.
export function loadPackage(modules, name) {
    try {
        return createRequire(path.join(modules, 'x.js'))(name);
    } catch (e) {
        console.error(`${name} not found under ${modules}: ${e.message}`);
        process.exit(3);
    }
}

// A GBNF rule body that allows exactly the text s.
export const gbnfLiteral = s => '"' + s.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n')
    .replace(/\r/g, '\\r').replace(/\t/g, '\\t') + '"';

// The arguments of a forced call of `name`: an object holding its schema's
// required keys, get_time's tz one of its enum, get_weather's city a string
// (the tools of serve_tools.mjs and serve_tools_apis.mjs).
export function checkForcedArgs(where, name, args, schema) {
    assert.ok(schema, `${where}: ${name} is a tool`);
    assert.equal(typeof args, 'object', where);
    for (const k of schema.required) assert.ok(k in args, `${where}: ${k} in ${JSON.stringify(args)}`);
    if (name === 'get_time') assert.ok(['UTC', 'CET'].includes(args.tz), where);
    if (name === 'get_weather') assert.equal(typeof args.city, 'string', where);
}

// Runs the checks (an async function returning how many replies it
// checked): prints "ok N", or "mismatch: ..." and exits 1.
export async function report(run) {
    let n;
    try {
        n = await run();
    } catch (e) {
        console.log(`mismatch: ${e.message}`);
        process.exit(1);
    }
    console.log(`ok ${n}`);
}

// The cases I,J,... (list) of tests/toolcall/cases.json (file): [[i, case]...].
export function selectedCases(file, list) {
    const cases = JSON.parse(fs.readFileSync(file, 'utf8'));
    return list.split(',').map(Number).map(i => [i, cases[i]]);
}
