/* LeadRouter: show the prospect who their rep is, right after they submit a form.
 *
 * <form method="post" action="https://leadrouter.example.com/api/v1/intake/website-form/?token=..."
 *       data-leadrouter>...</form>
 * <p data-leadrouter-owner hidden>Thank you! We will be in touch shortly.</p>
 * <script src="https://leadrouter.example.com/embed/owner.js" async></script>
 *
 * On submit the form is posted with fetch (form-encoded, no cookies), the page waits on the
 * lead's status URL for at most data-leadrouter-wait seconds (default 10), and the element
 * [data-leadrouter-owner] then shows "Your rep is Ana — book a time", or keeps its own text (the
 * fallback) when no owner is known in time. Options on the form: data-leadrouter-text ("Your rep
 * is {name}"), data-leadrouter-book ("book a time"), data-leadrouter-wait. The form also gets a
 * "leadrouter:status" event whose detail is the status document (or null). The source must list
 * this page's origin in its CORS origins. docs/api.md, "Showing the owner on the form page".
 */
(function () {
  "use strict";

  function target(form) {
    var id = form.getAttribute("data-leadrouter-target");
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
    form.dispatchEvent(new CustomEvent("leadrouter:status", { detail: doc }));
    if (!box) return;
    var owner = doc && doc.status === "assigned" ? doc.owner : null;
    if (owner && owner.name) {
      var text = form.getAttribute("data-leadrouter-text") || "Your rep is {name}";
      var parts = text.split("{name}");
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
      var name = document.createElement("strong");
      name.textContent = owner.name;
      box.appendChild(name);
      box.appendChild(document.createTextNode(parts.slice(1).join(owner.name)));
      var booking = owner.booking_url && safeUrl(owner.booking_url);
      if (booking) {
        box.appendChild(document.createTextNode(" \u2014 "));
        var link = document.createElement("a");
        link.href = booking;
        link.target = "_blank";
        link.rel = "noopener";
        link.textContent = form.getAttribute("data-leadrouter-book") || "book a time";
        box.appendChild(link);
      }
      box.setAttribute("data-leadrouter-state", "owner");
    } else {
      box.setAttribute("data-leadrouter-state", "fallback");
    }
    box.hidden = false;
  }

  function getJson(url) {
    return fetch(url, { credentials: "omit", cache: "no-store" }).then(function (response) {
      if (!response.ok) throw new Error("HTTP " + response.status);
      return response.json();
    });
  }

  function follow(form, statusUrl, deadline) {
    var left = Math.floor((deadline - Date.now()) / 1000);
    if (left < 1) return Promise.resolve(null);
    var url = new URL(statusUrl);
    url.searchParams.set("wait", String(Math.min(left, 10)));
    return getJson(url.href).then(function (doc) {
      if (doc.status === "received" || doc.status === "processing") {
        return follow(form, statusUrl, deadline);
      }
      return doc;
    });
  }

  function submit(event) {
    var form = event.target;
    if (!form || !form.hasAttribute || !form.hasAttribute("data-leadrouter")) return;
    event.preventDefault();
    if (form.getAttribute("data-leadrouter-sent")) return;
    form.setAttribute("data-leadrouter-sent", "1");
    var seconds = parseFloat(form.getAttribute("data-leadrouter-wait")) || 10;
    var deadline = Date.now() + seconds * 1000;
    var body = new URLSearchParams(new FormData(form));
    fetch(form.action, { method: "POST", body: body, credentials: "omit" })
      .then(function (response) {
        if (response.status !== 202) throw new Error("HTTP " + response.status);
        return response.json();
      })
      .then(function (accepted) {
        form.hidden = true;
        if (!accepted.status_url) return null;
        return follow(form, new URL(accepted.status_url, form.action).href, deadline);
      })
      .then(
        function (doc) { show(form, doc); },
        function () { show(form, null); }
      );
  }

  document.addEventListener("submit", submit, true);
})();
