#!/usr/bin/env node
// Copies the repository's proto/rollout/ tree (every .proto under it) and
// proto/buf/ (protovalidate's validate.proto, vendored: the contract's files
// import it for their field rules, and proto-loader fails without it) into
// this package's proto/ folder: the copy the client loads at run time, that
// `npm run gen` generates the TypeScript types from, and that `npm pack`
// ships. Run by `npm run build` (and so by `npm pack`, through prepack).
// The repository's proto/ stays the single source of truth; proto/ here is a
// build output, not checked in.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

const pkg = path.resolve(__dirname, "..");
const root = path.resolve(pkg, "..", "..", "proto");
const source = path.join(root, "rollout");

if (!fs.existsSync(path.join(source, "v1", "rollout.proto"))) {
  console.error(
    `copy-proto: ${path.join(source, "v1", "rollout.proto")} not found; ` +
      "build the package from a checkout of the repository (client/node)",
  );
  process.exit(1);
}
fs.rmSync(path.join(pkg, "proto"), { recursive: true, force: true });
for (const tree of ["rollout", "buf"]) {
  fs.cpSync(path.join(root, tree), path.join(pkg, "proto", tree), {
    recursive: true,
    // buf/validate's LICENSE travels with its file (Apache-2.0).
    filter: (p) =>
      fs.statSync(p).isDirectory() || p.endsWith(".proto") || path.basename(p) === "LICENSE",
  });
}
