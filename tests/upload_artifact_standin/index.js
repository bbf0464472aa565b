// The part of actions/upload-artifact v4 (src/upload/upload-artifact.ts) that the ckpt-guard action uses:
// every listed file or directory, its least common ancestor as the root, one upload through @actions/artifact.
// The test prepends `module.paths.unshift(<the project's node_modules>)`.
const fs = require('fs');
const path = require('path');
const core = require('@actions/core');
const {DefaultArtifactClient} = require('@actions/artifact');

function collect(entry, hidden, out) {
  const stat = fs.statSync(entry);
  if (!stat.isDirectory()) { out.push(entry); return; }
  for (const child of fs.readdirSync(entry).sort()) {
    if (!hidden && child.startsWith('.')) continue;
    collect(path.join(entry, child), hidden, out);
  }
}

async function run() {
  const name = core.getInput('name') || 'artifact';
  const hidden = core.getInput('include-hidden-files') === 'true';
  const roots = core.getInput('path', {required: true}).split('\n').map((s) => s.trim()).filter(Boolean)
    .map((p) => path.resolve(p)).filter((p) => fs.existsSync(p));
  const files = [];
  for (const root of roots) collect(root, hidden, files);
  if (files.length === 0) {
    const message = `No files were found with the provided path: ${roots.join(', ')}. No artifacts will be uploaded.`;
    const mode = core.getInput('if-no-files-found');
    if (mode === 'error') core.setFailed(message); else if (mode === 'warn') core.warning(message); else core.info(message);
    return;
  }
  const rootDirectory = roots.length === 1 && fs.statSync(roots[0]).isDirectory() ? roots[0] : path.dirname(roots[0]);
  const options = {};
  const days = parseInt(core.getInput('retention-days') || '0', 10);
  if (days > 0) options.retentionDays = days;
  options.compressionLevel = parseInt(core.getInput('compression-level') || '6', 10);
  const response = await new DefaultArtifactClient().uploadArtifact(name, files, rootDirectory, options);
  core.info(`Artifact ${name} has been successfully uploaded! Final size is ${response.size} bytes. Artifact ID is ${response.id}`);
  core.setOutput('artifact-id', response.id);
}

run().catch((error) => core.setFailed(error.message));
