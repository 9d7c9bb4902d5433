/* LeadRouter: show the prospect who their rep is, right after they submit a form.
 *
 * <form method="post" action="https://leadrouter.example.com/api/v1/intake/website-form/?token=..."
 *       data-leadrouter>...</form>
 * <p data-leadrouter-owner hidden>Thank you! We will be in touch shortly.</p>
 * <script src="https://leadrouter.example.com/embed/owner.js" async></script>
 *
 * On submit the form is posted with fetch (form-encoded, no cookies), the page waits on the
 * lead's status URL, and the element [data-leadrouter-owner] shows "Your rep is Ana — book a
 * time", or keeps its own text (the fallback) when no owner is known by the deadline:
 * data-leadrouter-wait seconds (default 10, at most 60) after the submit, however the POST or
 * the status requests hang, fail or answer nonsense. One flow per form, however often the
 * script is included or the submit fires; nothing is thrown into the page. Options on the form: data-leadrouter-text ("Your rep
 * is {name}"), data-leadrouter-book ("book a time"), data-leadrouter-wait. The form also gets a
 * "leadrouter:status" event whose detail is the status document (or null). The source must list
 * this page's origin in its CORS origins. docs/api.md, "Showing the owner on the form page".
 */
(function () {
  "use strict";
  if (window.__leadrouterOwner) return; // included twice: one listener
  window.__leadrouterOwner = true;

  // Through the prototypes: a form field named "action" or "hidden" shadows the form's own.
  var proto = Element.prototype;
  function attr(el, name) { return proto.getAttribute.call(el, name); }
  function hasAttr(el, name) { return proto.hasAttribute.call(el, name); }
  function setAttr(el, name, value) { proto.setAttribute.call(el, name, value); }

  var PACE = 1000; // ms at least between two status requests

  function target(form) {
    var id = attr(form, "data-leadrouter-target");
    return (id && document.getElementById(id)) || document.querySelector("[data-leadrouter-owner]");
  }

  function safeUrl(value) {
    try {
      var url = new URL(value);
      return url.protocol === "https:" || url.protocol === "http:" ? url.href : null;
    } catch (e) {
      return null;
    }
  }

  function show(form, doc) {
    var box = target(form);
    EventTarget.prototype.dispatchEvent.call(
      form, new CustomEvent("leadrouter:status", { detail: doc })
    );
    if (!box) return;
    var owner = doc && doc.status === "assigned" ? doc.owner : null;
    if (owner && typeof owner === "object" && owner.name) {
      var text = attr(form, "data-leadrouter-text") || "Your rep is {name}";
      var parts = text.split("{name}");
      var name = String(owner.name);
      box.textContent = "";
      var photo = owner.photo_url && safeUrl(owner.photo_url);
      if (photo) {
        var img = document.createElement("img");
        img.src = photo;
        img.alt = "";
        img.width = 48;
        img.height = 48;
        img.setAttribute("data-leadrouter-photo", "");
        box.appendChild(img);
        box.appendChild(document.createTextNode(" "));
      }
      box.appendChild(document.createTextNode(parts[0]));
      var strong = document.createElement("strong");
      strong.textContent = name;
      box.appendChild(strong);
      box.appendChild(document.createTextNode(parts.slice(1).join(name)));
      var booking = owner.booking_url && safeUrl(owner.booking_url);
      if (booking) {
        box.appendChild(document.createTextNode(" \u2014 "));
        var link = document.createElement("a");
        link.href = booking;
        link.target = "_blank";
        link.rel = "noopener";
        link.textContent = attr(form, "data-leadrouter-book") || "book a time";
        box.appendChild(link);
      }
      box.setAttribute("data-leadrouter-state", "owner");
    } else {
      box.setAttribute("data-leadrouter-state", "fallback");
    }
    box.hidden = false;
  }

  function pause(ms) {
    return new Promise(function (resolve) { setTimeout(resolve, Math.max(0, ms)); });
  }

  function run(form) {
    var seconds = parseFloat(attr(form, "data-leadrouter-wait"));
    seconds = seconds > 0 ? Math.min(seconds, 60) : 10;
    var deadline = Date.now() + seconds * 1000;
    var abort = typeof AbortController === "function" ? new AbortController() : null;
    var done = false;
    var timer = setTimeout(function () { finish(null); }, seconds * 1000);

    function finish(doc) {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (abort) abort.abort();
      try { show(form, doc); } catch (e) { /* never into the page */ }
    }

    function request(url, init) {
      init.credentials = "omit";
      if (abort) init.signal = abort.signal;
      return fetch(url, init);
    }

    // Asks until an outcome or the deadline; each wait ends half a second before it.
    function follow(statusUrl) {
      var asked = Date.now();
      var left = deadline - asked;
      if (done || left <= 0) return null;
      var url = new URL(statusUrl);
      url.searchParams.set("wait", String(Math.max(0, Math.min(10, Math.floor((left - 500) / 1000)))));
      return request(url.href, { cache: "no-store" })
        .then(function (response) {
          if (response.status === 404) return "gone"; // expired or unknown: nothing to wait for
          if (!response.ok) return null; // a 5xx, a proxy's page: ask again
          return response.json().then(null, function () { return null; });
        })
        .then(null, function () { return null; }) // the network: ask again
        .then(function (doc) {
          if (doc === "gone" || done) return null;
          var known = doc && typeof doc === "object" && typeof doc.status === "string";
          if (known && doc.status !== "received" && doc.status !== "processing") return doc;
          return pause(PACE - (Date.now() - asked)).then(function () { return follow(statusUrl); });
        });
    }

    try {
      var action = new URL(attr(form, "action") || "", document.baseURI).href;
      request(action, { method: "POST", body: new URLSearchParams(new FormData(form)) })
        .then(function (response) {
          if (response.status !== 202) throw new Error("HTTP " + response.status);
          return response.json();
        })
        .then(function (accepted) {
          if (done) return null;
          setAttr(form, "hidden", "");
          var statusUrl = accepted && accepted.status_url;
          return typeof statusUrl === "string" ? follow(new URL(statusUrl, action).href) : null;
        })
        .then(finish, function () { finish(null); });
    } catch (e) {
      finish(null);
    }
  }

  document.addEventListener("submit", function (event) {
    try {
      var form = event.target;
      if (!(form instanceof HTMLFormElement) || !hasAttr(form, "data-leadrouter")) return;
      event.preventDefault();
      if (hasAttr(form, "data-leadrouter-sent")) return; // one flow per form
      setAttr(form, "data-leadrouter-sent", "1");
      run(form);
    } catch (e) { /* never into the page */ }
  }, true);
})();
