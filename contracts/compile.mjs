// Compile contracts/TestUSDC.sol with solc-js (npm `solc`, pinned in package-lock.json) into
// build/contracts/TestUSDC.json ({contractName, compiler, abi, bytecode}). Run by `make install`
// (its own stamp: the output file), so no bytecode is ever committed — it is built from this source.
// Usage: node contracts/compile.mjs [output-dir]
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const solc = require('solc')

const here = dirname(fileURLToPath(import.meta.url))
const outDir = process.argv[2] ?? join(here, '..', 'build', 'contracts')
const source = 'TestUSDC.sol'

const input = {
  language: 'Solidity',
  sources: { [source]: { content: readFileSync(join(here, source), 'utf8') } },
  settings: {
    // Paris: no PUSH0/MCOPY surprises on any EVM this may be pointed at; Anvil runs them all.
    evmVersion: 'paris',
    optimizer: { enabled: true, runs: 200 },
    outputSelection: { '*': { '*': ['abi', 'evm.bytecode.object'] } }
  }
}

const output = JSON.parse(solc.compile(JSON.stringify(input)))
const errors = (output.errors ?? []).filter((e) => e.severity === 'error')
for (const message of output.errors ?? []) console.error(message.formattedMessage)
if (errors.length) process.exit(1)

const contract = output.contracts[source].TestUSDC
const artifact = {
  contractName: 'TestUSDC',
  compiler: `solc-js ${solc.version()}`,
  abi: contract.abi,
  bytecode: '0x' + contract.evm.bytecode.object
}
mkdirSync(outDir, { recursive: true })
// Write then rename: a reader (or an interrupted build) never sees half an artifact.
const target = join(outDir, 'TestUSDC.json')
writeFileSync(target + '.tmp', JSON.stringify(artifact, null, 2) + '\n')
renameSync(target + '.tmp', target)
console.log(`[memoryhub] compiled ${source} with ${artifact.compiler} -> ${target}`)
