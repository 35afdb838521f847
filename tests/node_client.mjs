// node_client.mjs - what the npm-client drivers of tests/test_serve.c share:
// loading a package from the folder scripts/deps.sh installs into.
import { createRequire } from 'node:module';
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
