// Compile MemoryHub's contracts with solc-js (npm `solc`, pinned in package-lock.json), one
// artifact per contract: build/contracts/<Name>.json ({contractName, compiler, abi, bytecode}).
//   TestUSDC.sol     the development chain's USDC-like token (EIP-3009)
//   OwnerWallet.sol  a minimal EIP-1271 contract wallet for the tests (tests/billing/test_wallets.py)
// Run by `make install` (the artifacts are their own stamps), so no bytecode is ever committed —
// it is built from these sources.
// Usage: node contracts/compile.mjs [output-dir]
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const solc = require('solc')

const here = dirname(fileURLToPath(import.meta.url))
const outDir = process.argv[2] ?? join(here, '..', 'build', 'contracts')
// Each source holds one contract of the same name.
const contracts = ['TestUSDC', 'OwnerWallet']

const input = {
  language: 'Solidity',
  sources: Object.fromEntries(
    contracts.map((name) => [`${name}.sol`, { content: readFileSync(join(here, `${name}.sol`), 'utf8') }])
  ),
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

mkdirSync(outDir, { recursive: true })
for (const name of contracts) {
  const contract = output.contracts[`${name}.sol`][name]
  const artifact = {
    contractName: name,
    compiler: `solc-js ${solc.version()}`,
    abi: contract.abi,
    bytecode: '0x' + contract.evm.bytecode.object
  }
  // Write then rename: a reader (or an interrupted build) never sees half an artifact.
  const target = join(outDir, `${name}.json`)
  writeFileSync(target + '.tmp', JSON.stringify(artifact, null, 2) + '\n')
  renameSync(target + '.tmp', target)
  console.log(`[memoryhub] compiled ${name}.sol with ${artifact.compiler} -> ${target}`)
}
