// The HTTP/1.1 transport of `strata serve`, on Boost.Beast (parser and serializer) and Boost.Asio
// (sockets and timers): a listening socket of its own (exclusive: no SO_REUSEPORT), a thread per
// admitted connection, and the limits a server facing untrusted clients needs, which Debian's
// cpp-httplib 0.11 cannot express (its read timeout restarts with every byte, it has no
// connection cap, and it waits for an impossible Content-Length):
//   - a deadline for a request's headers and another for its body (absolute, not idle timeouts),
//     answered 408 when missed;
//   - connection caps, total and per peer address, answered 503 at once beyond them (a refused
//     connection never gets a thread: its request is drained for at most a second on the
//     acceptor's own event loop, then the 503 is written);
//   - Content-Length checked against the body limit when the headers end (413 at once; a
//     malformed or overflowing length is a 400), header size capped (431);
//   - a handler can ask whether its client hung up (Connection::ClientGone) while it waits, and a
//     streamed body learns it from its writes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "core/status.h"

namespace strata::serve::http {

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent
  std::string path;    // the target without its query
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string peer;  // the client's address
  // The header's value ("" when absent); `name` lower-case.
  std::string Header(const std::string& name) const;
};

// A streamed (chunked) body's writer.
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  // Sends one chunk; false when the client is gone (or stalled past the write timeout).
  virtual bool Write(std::string_view data) = 0;
  // True when the client has closed its side (a cheap, non-blocking check).
  virtual bool ClientGone() = 0;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // When set, the body is sent with chunked encoding, written by this function (body ignored).
  std::function<void(StreamSink&)> stream;
  void SetHeader(std::string name, std::string value) {
    headers.emplace_back(std::move(name), std::move(value));
  }
};

// What a handler may ask of its connection while it works.
class Connection {
 public:
  virtual ~Connection() = default;
  virtual bool ClientGone() = 0;
};

using Handler = std::function<void(const Request&, Response&, Connection&)>;

struct Options {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port
  int64_t max_body_bytes = int64_t{4} << 20;
  int64_t max_header_bytes = 16 << 10;
  int header_timeout_s = 10;      // a request's headers must have arrived within this
  int body_timeout_s = 30;        // and its body within this, after the headers
  int write_timeout_s = 30;       // one write that makes no progress for this long ends it
  int keep_alive_s = 5;           // an idle kept-alive connection is closed after this
  int max_requests_per_connection = 1000;
  int max_connections = 256;      // beyond: 503
  int max_connections_per_peer = 128;
  int backlog = 1024;
};

class Server {
 public:
  explicit Server(Options o);
  ~Server();  // Stop()

  // Exact paths. A known path with another method is a 405 with Allow.
  void Route(const std::string& method, const std::string& path, Handler h);
  // Paths that start with `prefix` (e.g. "/v1/models/"), tried after the exact ones.
  void RoutePrefix(const std::string& method, const std::string& prefix, Handler h);
  // Runs before routing; returns true when it answered (e.g. a refused API key).
  void SetPreRouting(std::function<bool(const Request&, Response&)> f) { pre_ = std::move(f); }
  // Fills the body of an error the transport answers itself (status, a short code, a message).
  void SetErrorFormatter(std::function<void(Response&, int, const std::string&,
                                            const std::string&)> f) {
    error_ = std::move(f);
  }
  // Called after every answered request (the metrics).
  void SetLogger(std::function<void(const Request&, const Response&)> f) { log_ = std::move(f); }

  // Binds and listens (the port is exclusive: a port in use is an error naming it). Returns the
  // port (useful with port 0).
  StatusOr<int> Bind();
  // Accepts connections on a background thread until Stop.
  void Start();
  // Stops accepting, wakes idle connections and waits for every connection's thread to end.
  // Idempotent.
  void Stop();

  int active_connections() const { return active_.load(); }
  int64_t refused_connections() const { return refused_.load(); }

 private:
  struct Impl;
  struct Route_ {
    std::string method, path;
    bool prefix = false;
    Handler h;
  };
  friend struct Impl;
  void Dispatch(const Request& req, Response& res, Connection& conn);
  void FormatError(Response& res, int status, const std::string& code, const std::string& msg);

  Options o_;
  std::vector<Route_> routes_;
  std::function<bool(const Request&, Response&)> pre_;
  std::function<void(Response&, int, const std::string&, const std::string&)> error_;
  std::function<void(const Request&, const Response&)> log_;
  std::unique_ptr<Impl> impl_;
  std::thread acceptor_;
  std::atomic<int> active_{0};
  std::atomic<int64_t> refused_{0};
  std::atomic<bool> stopping_{false};
  std::mutex mu_;  // guards the connection table below and Stop
  std::condition_variable cv_;
  std::map<std::string, int> per_peer_;
  std::map<int, bool> fds_;  // open connections' sockets -> idle (waiting for a request)
  bool stopped_ = false;
  bool started_ = false;
};

}  // namespace strata::serve::http
