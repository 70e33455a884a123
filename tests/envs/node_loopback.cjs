// Preloaded into a Node server (node --require this-file ...) that listens on a port without
// naming a host (server-everything's streamable HTTP mode: `app.listen(PORT)`), so that it
// binds 127.0.0.1 instead of every interface. A listen call that names a host is left alone.
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const port = args[0];
  const portOnly = typeof port === "number" || (typeof port === "string" && /^\d+$/.test(port));
  if (portOnly && typeof args[1] !== "string") {
    args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};
