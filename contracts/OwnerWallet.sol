// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title OwnerWallet — the smallest contract wallet, for MemoryHub's EIP-1271 tests.
/// @notice One owner (an externally owned account) controls it: the wallet "signs" whatever its
/// owner signs (EIP-1271 `isValidSignature`), and only the owner can make it call another
/// contract (`execute`), e.g. move its USDC with `transfer`. That is all a smart-contract wallet
/// (Safe, Coinbase Smart Wallet, …) does from MemoryHub's point of view: linking it by SIWE asks
/// the chain whether the contract accepts the signature, and its payments are `Transfer` logs
/// whose sender is the contract's address. Deployed only on a local Anvil node (tests).
contract OwnerWallet {
    bytes4 private constant _MAGIC_VALUE = 0x1626ba7e; // bytes4(keccak256("isValidSignature(bytes32,bytes)"))
    bytes4 private constant _INVALID = 0xffffffff;
    // Half the curve order: signatures with a larger s are the malleable twin of a valid one (EIP-2).
    uint256 private constant _HALF_ORDER = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0;

    address public immutable owner;

    constructor(address owner_) {
        require(owner_ != address(0), "OwnerWallet: no owner");
        owner = owner_;
    }

    /// @notice EIP-1271: the magic value when `signature` (65 bytes r‖s‖v) is the owner's
    /// signature of `hash`, anything else otherwise (never a revert, as the EIP recommends).
    function isValidSignature(bytes32 hash, bytes calldata signature) external view returns (bytes4) {
        if (signature.length != 65) return _INVALID;
        bytes32 r = bytes32(signature[0:32]);
        bytes32 s = bytes32(signature[32:64]);
        uint8 v = uint8(signature[64]);
        if (v < 27) v += 27;
        if (uint256(s) > _HALF_ORDER || (v != 27 && v != 28)) return _INVALID;
        address signer = ecrecover(hash, v, r, s);
        return signer != address(0) && signer == owner ? _MAGIC_VALUE : _INVALID;
    }

    /// @notice The owner makes the wallet call `target` (with `value` wei and `data`); a revert
    /// of the call is passed on unchanged.
    function execute(address target, uint256 value, bytes calldata data) external returns (bytes memory) {
        require(msg.sender == owner, "OwnerWallet: only the owner");
        (bool ok, bytes memory result) = target.call{value: value}(data);
        if (!ok) {
            assembly {
                revert(add(result, 32), mload(result))
            }
        }
        return result;
    }

    receive() external payable {}
}
