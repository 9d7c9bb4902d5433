// Tell the server the browser's time zone (a cookie read by audit.timezones), so that pages show
// times in it when the user chose none. One reload when the page was drawn in another zone
// because the cookie was missing or stale; never a loop (the reload happens only when the
// cookie changes).
(function () {
  var zone;
  try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone; } catch (e) { return; }
  if (!zone) return;
  var match = document.cookie.match(/(?:^|;\s*)lr_tz=([^;]*)/);
  var current = match ? decodeURIComponent(match[1]) : "";
  if (current === zone) return;
  // Zone names are letters, digits, "/", "_", "+" and "-": safe in a cookie as they are.
  if (!/^[A-Za-z0-9\/_+-]{1,64}$/.test(zone)) return;
  document.cookie = "lr_tz=" + zone + "; path=/; max-age=31536000; SameSite=Lax";
  var html = document.documentElement;
  if (html.dataset.tzSource !== "user" && html.dataset.tz !== zone) location.reload();
})();
