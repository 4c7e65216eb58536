// The billing page's browser wallet (EIP-1193 `window.ethereum`), loaded as a file: the CSP
// forbids inline scripts. Two actions, both ending in the same API routes an agent uses, called
// with the dashboard's session cookie and CSRF token:
//  - "Connect wallet": eth_requestAccounts → the server builds the EIP-4361 message with a fresh
//    nonce (and the EIP-55 address) → personal_sign → POST /api/v1/wallets/link.
//  - "Pay with connected wallet": eth_sendTransaction of the USDC transfer(treasury, amount) →
//    POST /api/v1/subscriptions/payments/confirm with its hash (pending until enough blocks).
(function () {
  "use strict";

  function say(element, text) { if (element) element.textContent = text; }

  function provider() {
    if (!window.ethereum || typeof window.ethereum.request !== "function") {
      throw new Error("No browser wallet found. Install one (for example MetaMask), or pay from any wallet with the payment link.");
    }
    return window.ethereum;
  }

  function post(url, csrf, body, json) {
    var headers = { "X-CSRFToken": csrf, "Accept": "application/json" };
    var payload;
    if (json) { headers["Content-Type"] = "application/json"; payload = JSON.stringify(body); }
    else { headers["Content-Type"] = "application/x-www-form-urlencoded"; payload = new URLSearchParams(body).toString(); }
    return fetch(url, { method: "POST", credentials: "same-origin", headers: headers, body: payload })
      .then(function (response) {
        return response.text().then(function (text) {
          var data = null;
          try { data = JSON.parse(text); } catch (ignored) { data = null; }
          if (!response.ok) {
            var message = data && data.error && data.error.message ? data.error.message : "The server refused (" + response.status + ").";
            throw new Error(message);
          }
          return data;
        });
      });
  }

  function reason(error) { return (error && error.message) ? error.message : String(error); }

  function connect(box) {
    var status = box.querySelector("#wallet-status");
    var csrf = box.getAttribute("data-csrf");
    var wallet;
    try { wallet = provider(); } catch (error) { say(status, reason(error)); return; }
    var address;
    say(status, "Asking your wallet…");
    wallet.request({ method: "eth_requestAccounts" })
      .then(function (accounts) {
        address = accounts[0];
        return post(box.getAttribute("data-message-url"), csrf, { address: address }, false);
      })
      .then(function (data) {
        say(status, "Sign the message in your wallet (it moves no funds)…");
        return wallet.request({ method: "personal_sign", params: [data.message, address] })
          .then(function (signature) {
            return post(box.getAttribute("data-link-url"), csrf, { message: data.message, signature: signature }, true);
          });
      })
      .then(function (linked) {
        say(status, "Linked " + linked.address + ".");
        window.location.reload();
      })
      .catch(function (error) { say(status, "Not linked: " + reason(error)); });
  }

  function word(hex) { return hex.replace(/^0x/, "").toLowerCase().padStart(64, "0"); }

  function pay(box) {
    var status = box.querySelector("#pay-status");
    var csrf = box.getAttribute("data-csrf");
    var chainId = box.getAttribute("data-chain-id");
    var wallet;
    try { wallet = provider(); } catch (error) { say(status, reason(error)); return; }
    // ERC-20 transfer(address,uint256): selector a9059cbb, then both arguments as 32-byte words.
    var data = "0xa9059cbb" + word(box.getAttribute("data-treasury")) +
      word(BigInt(box.getAttribute("data-amount")).toString(16));
    var from;
    say(status, "Asking your wallet…");
    wallet.request({ method: "eth_requestAccounts" })
      .then(function (accounts) {
        from = accounts[0];
        return wallet.request({ method: "eth_chainId" });
      })
      .then(function (current) {
        if (parseInt(current, 16) === parseInt(chainId, 16)) return null;
        return wallet.request({ method: "wallet_switchEthereumChain", params: [{ chainId: chainId }] });
      })
      .then(function () {
        say(status, "Approve the transfer in your wallet…");
        return wallet.request({ method: "eth_sendTransaction", params: [{ from: from, to: box.getAttribute("data-usdc"), data: data, value: "0x0" }] });
      })
      .then(function (txHash) {
        say(status, "Sent " + txHash + "; checking it…");
        return post(box.getAttribute("data-confirm-url"), csrf, { payment_id: box.getAttribute("data-payment-id"), tx_hash: txHash }, true);
      })
      .then(function (result) {
        say(status, result.message);
        window.location.reload();
      })
      .catch(function (error) { say(status, "Not paid: " + reason(error)); });
  }

  // The usage chart (dashboard/views/billing.py _chart): one horizontal bar per limit, 100 % long,
  // stacked as in use / still free / past the limit, the numbers in each bar's label. Drawn here
  // rather than by app.js's generic charts, which draw vertical bars side by side.
  // Writes "N % in use" on each bar, right after its in-use part (inside it, in white, when the
  // rest of the bar has no room), so even a bar with nothing in use says so on the bar itself.
  var inUseText = {
    id: "inUseText",
    afterDatasetsDraw: function (chart) {
      var bars = chart.getDatasetMeta(0).data;
      var notes = chart.options.plugins.inUseText.notes || [];
      var ctx = chart.ctx;
      ctx.save();
      ctx.font = "600 12px system-ui, sans-serif";
      ctx.textBaseline = "middle";
      bars.forEach(function (bar, i) {
        var text = notes[i];
        if (!text) return;
        var width = ctx.measureText(text).width;
        var outside = chart.chartArea.right - bar.x > width + 12;
        ctx.fillStyle = outside ? "#1b2333" : "#ffffff";
        ctx.textAlign = outside ? "left" : "right";
        ctx.fillText(text, outside ? bar.x + 6 : bar.x - 6, bar.y);
      });
      ctx.restore();
    }
  };

  function drawUsage(canvas) {
    var source = document.getElementById(canvas.getAttribute("data-billing-chart"));
    if (!source || typeof window.Chart === "undefined") return;
    var spec = JSON.parse(source.textContent);
    new window.Chart(canvas, {
      type: "bar",
      data: {
        labels: spec.labels,
        datasets: spec.datasets.map(function (set) {
          return { label: set.label, data: set.data, backgroundColor: set.color, borderColor: set.color,
                   barPercentage: 0.8, categoryPercentage: 0.9 };
        })
      },
      plugins: [inUseText],
      options: {
        indexAxis: "y", responsive: true, maintainAspectRatio: false, animation: false,
        plugins: {
          inUseText: { notes: spec.notes },
          legend: { position: "bottom" },
          tooltip: { callbacks: { label: function (item) { return item.dataset.label + ": " + item.formattedValue + " %"; } } }
        },
        scales: {
          x: { stacked: true, min: 0, max: spec.max, title: { display: true, text: spec.x_label },
               ticks: { callback: function (value) { return value + " %"; } } },
          y: { stacked: true, ticks: { font: { size: 13 } } }
        }
      }
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("canvas[data-billing-chart]").forEach(drawUsage);
  });

  document.addEventListener("click", function (event) {
    if (event.target.closest("#connect-wallet")) connect(document.getElementById("wallet-connect"));
    if (event.target.closest("#pay-with-wallet")) pay(document.getElementById("wallet-pay"));
  });
})();
