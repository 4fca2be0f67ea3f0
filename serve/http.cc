// The HTTP/1.1 transport of `strata serve` (see http.h): Beast parses and serializes, each admitted
// connection runs its asynchronous reads and writes on an io_context of its own thread, so that a
// deadline (a timer that cancels the socket's operations) bounds a whole request, not each byte.
#include "serve/http.h"

#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <exception>

namespace strata::serve::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;

std::string Request::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? "" : it->second;
}

namespace {

using Clock = std::chrono::steady_clock;

// Starts one asynchronous operation on `ioc` (the calling thread's own) and runs it to its end or
// to `deadline`, when the socket's operations are cancelled (the socket stays open, so that a 408
// can still be written) and the result is beast::error::timeout.
template <class Start>
beast::error_code RunOp(net::io_context& ioc, tcp::socket& sock, net::steady_timer& timer,
                        Clock::time_point deadline, Start&& start) {
  beast::error_code out;
  bool fired = false;
  timer.expires_at(deadline);
  timer.async_wait([&](beast::error_code e) {
    if (e) return;
    fired = true;
    beast::error_code ignored;
    sock.cancel(ignored);
  });
  start([&](beast::error_code ec, std::size_t) {
    out = ec;
    timer.cancel();
  });
  ioc.restart();
  ioc.run();
  if (fired && out) out = beast::error::timeout;
  return out;
}

Clock::time_point In(int seconds) { return Clock::now() + std::chrono::seconds(seconds); }

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// True when the peer has closed its side of `fd` (nothing is consumed).
bool PeerClosed(int fd) {
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  if (p.revents & POLLIN) {
    char c;
    return ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
  return false;
}

}  // namespace

struct Server::Impl {
  net::io_context ioc;  // the acceptor's event loop (accepts, refusals)
  tcp::acceptor acceptor{ioc};
  net::steady_timer retry{ioc};
  int refusing = 0;  // refusals in flight (acceptor thread only)
  static constexpr int kMaxRefusing = 256;

  void Accept(Server* s);
  void Refuse(Server* s, tcp::socket sock, const std::string& why);
  static void Serve(Server* s, int fd, const std::string& peer, bool v6);
  static void Loop(Server* s, tcp::socket& sock, net::io_context& ioc, int fd,
                   const std::string& peer);
};

Server::Server(Options o) : o_(std::move(o)) {}

Server::~Server() { Stop(); }

void Server::Route(const std::string& method, const std::string& path, Handler h) {
  routes_.push_back({method, path, false, std::move(h)});
}

void Server::RoutePrefix(const std::string& method, const std::string& prefix, Handler h) {
  routes_.push_back({method, prefix, true, std::move(h)});
}

void Server::FormatError(Response& res, int status, const std::string& code,
                         const std::string& msg) {
  res.status = status;
  res.stream = nullptr;
  if (error_) {
    error_(res, status, code, msg);
  } else {
    res.content_type = "text/plain";
    res.body = msg + "\n";
  }
}

void Server::Dispatch(const Request& req, Response& res, Connection& conn) {
  if (pre_ && pre_(req, res)) return;
  const Route_* match = nullptr;
  std::string allow;
  for (int pass = 0; pass < 2 && !match && allow.empty(); ++pass) {
    for (const Route_& r : routes_) {
      if (r.prefix != (pass == 1)) continue;
      const bool hit = r.prefix ? req.path.size() > r.path.size() &&
                                      req.path.compare(0, r.path.size(), r.path) == 0
                                : req.path == r.path;
      if (!hit) continue;
      allow += (allow.empty() ? "" : ", ") + r.method;
      if (r.method == req.method) match = &r;
    }
  }
  if (!match && allow.empty()) {
    std::string known;
    for (const Route_& r : routes_) {
      known += (known.empty() ? "" : ", ") + r.method + " " + r.path + (r.prefix ? "{id}" : "");
    }
    return FormatError(res, 404, "not_found",
                       "no route " + req.method + " " + req.path + " (" + known + ")");
  }
  if (!match) {
    FormatError(res, 405, "method_not_allowed",
                req.method + " is not allowed on " + req.path + " (allowed: " + allow + ")");
    res.SetHeader("Allow", allow);
    return;
  }
  try {
    match->h(req, res, conn);
  } catch (const std::exception& e) {
    res = Response{};
    FormatError(res, 500, "", std::string("internal error: ") + e.what());
  } catch (...) {
    res = Response{};
    FormatError(res, 500, "", "internal error: unknown exception");
  }
}

StatusOr<int> Server::Bind() {
  impl_ = std::make_unique<Impl>();
  beast::error_code ec;
  net::ip::address addr = net::ip::make_address(o_.host, ec);
  if (ec) {
    tcp::resolver resolver(impl_->ioc);
    auto found = resolver.resolve(o_.host, "", ec);
    if (ec || found.empty()) {
      return InvalidArgument("--host " + o_.host + ": not an address this machine can resolve (" +
                             ec.message() + ")");
    }
    addr = found.begin()->endpoint().address();
  }
  const tcp::endpoint ep(addr, static_cast<unsigned short>(o_.port));
  const std::string where = o_.host + ":" + std::to_string(o_.port);
  tcp::acceptor& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (ec) return IoError("cannot open a socket for " + where + ": " + ec.message());
  // SO_REUSEADDR only (a restart may bind while old connections linger in TIME_WAIT); never
  // SO_REUSEPORT, which would let a second server share the port and take half the requests.
  a.set_option(net::socket_base::reuse_address(true), ec);
  a.bind(ep, ec);
  if (ec == net::error::address_in_use) {
    return IoError("port " + std::to_string(o_.port) + " on " + o_.host +
                   " is in use (another process listens there): choose another --port");
  }
  if (ec) return IoError("cannot bind to " + where + ": " + ec.message());
  a.listen(o_.backlog, ec);
  if (ec) return IoError("cannot listen on " + where + ": " + ec.message());
  return static_cast<int>(a.local_endpoint().port());
}

void Server::Start() {
  started_ = true;
  acceptor_ = std::thread([this] {
    impl_->Accept(this);
    impl_->ioc.run();
  });
}

void Server::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    // Connections waiting for (or reading) a request are woken; those in a handler finish it.
    for (const auto& [fd, reading] : fds_) {
      if (reading) ::shutdown(fd, SHUT_RDWR);
    }
  }
  if (impl_ && started_) {
    net::post(impl_->ioc, [this] {
      beast::error_code ec;
      impl_->acceptor.close(ec);
      impl_->retry.cancel();
    });
    if (acceptor_.joinable()) acceptor_.join();
  }
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return active_.load() == 0; });
}

void Server::Impl::Accept(Server* s) {
  acceptor.async_accept([this, s](beast::error_code ec, tcp::socket sock) {
    if (s->stopping_ || ec == net::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors or memory for a moment: try again shortly, not in a busy loop.
      retry.expires_after(std::chrono::milliseconds(100));
      retry.async_wait([this, s](beast::error_code e) {
        if (!e && !s->stopping_) Accept(s);
      });
      return;
    }
    beast::error_code e2;
    const tcp::endpoint ep = sock.remote_endpoint(e2);
    const std::string peer = e2 ? std::string("?") : ep.address().to_string();
    std::string why;
    {
      std::lock_guard<std::mutex> l(s->mu_);
      int& mine = s->per_peer_[peer];
      if (s->active_.load() >= s->o_.max_connections) {
        why = "the server holds its maximum of " + std::to_string(s->o_.max_connections) +
              " connections (--max-connections)";
      } else if (mine >= s->o_.max_connections_per_peer) {
        why = "your address holds the maximum of " + std::to_string(s->o_.max_connections_per_peer) +
              " connections per client (--max-connections-per-peer)";
      } else {
        ++mine;
        ++s->active_;
      }
      if (mine == 0) s->per_peer_.erase(peer);
    }
    if (why.empty()) {
      const bool v6 = ep.protocol() == tcp::v6();
      const int fd = sock.release(e2);
      if (e2) {
        std::lock_guard<std::mutex> l(s->mu_);
        --s->active_;
        if (--s->per_peer_[peer] == 0) s->per_peer_.erase(peer);
        s->cv_.notify_all();
      } else {
        {
          std::lock_guard<std::mutex> l(s->mu_);
          s->fds_[fd] = true;
        }
        std::thread(&Impl::Serve, s, fd, peer, v6).detach();
      }
    } else {
      ++s->refused_;
      Refuse(s, std::move(sock), why);
    }
    Accept(s);
  });
}

// A connection over the caps: its request is read (for at most a second, 16 KiB at most, on this
// event loop, no thread of its own) so that the 503 is not lost to a reset, then answered.
void Server::Impl::Refuse(Server* s, tcp::socket sock, const std::string& why) {
  beast::error_code ec;
  if (refusing >= kMaxRefusing) {
    sock.close(ec);
    return;
  }
  ++refusing;
  struct Refusal {
    explicit Refusal(tcp::socket so, net::io_context& io) : sock(std::move(so)), timer(io) {}
    tcp::socket sock;
    net::steady_timer timer;
    std::array<char, 4096> buf{};
    std::string seen;
    size_t total = 0;
    std::string reply;
    bool answered = false;
  };
  auto r = std::make_shared<Refusal>(std::move(sock), ioc);
  Response res;
  s->FormatError(res, 503, "too_many_connections", why + "; retry later");
  r->reply = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: " + res.content_type +
             "\r\nContent-Length: " + std::to_string(res.body.size()) +
             "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" + res.body;
  auto answer = [this, r] {
    if (r->answered) return;
    r->answered = true;
    r->timer.cancel();
    net::async_write(r->sock, net::buffer(r->reply), [this, r](beast::error_code, std::size_t) {
      beast::error_code e;
      r->sock.shutdown(tcp::socket::shutdown_send, e);
      r->sock.close(e);
      --refusing;
    });
  };
  r->timer.expires_after(std::chrono::seconds(1));
  r->timer.async_wait([answer](beast::error_code e) {
    if (!e) answer();
  });
  auto read = std::make_shared<std::function<void()>>();
  *read = [r, read, answer] {
    r->sock.async_read_some(net::buffer(r->buf), [r, read, answer](beast::error_code e, size_t n) {
      if (e) return answer();
      r->seen.append(r->buf.data(), n);
      r->total += n;
      if (r->seen.size() > 8) r->seen.erase(0, r->seen.size() - 8);
      if (r->total >= (16 << 10) || r->seen.find("\r\n\r\n") != std::string::npos) {
        *read = nullptr;  // breaks the cycle
        return answer();
      }
      (*read)();
    });
  };
  (*read)();
}

namespace {

class StreamConnection final : public Connection {
 public:
  explicit StreamConnection(int fd) : fd_(fd) {}
  bool ClientGone() override { return PeerClosed(fd_); }

 private:
  int fd_;
};

class ChunkSink final : public StreamSink {
 public:
  ChunkSink(tcp::socket& sock, net::steady_timer& timer, net::io_context& ioc, int fd,
            int write_timeout_s)
      : sock_(sock), timer_(timer), ioc_(ioc), fd_(fd), timeout_(write_timeout_s) {}
  bool Write(std::string_view data) override {
    if (failed_) return false;
    if (data.empty()) return true;
    beast::error_code ec = RunOp(ioc_, sock_, timer_, In(timeout_), [&](auto h) {
      net::async_write(sock_, bhttp::make_chunk(net::buffer(data.data(), data.size())), h);
    });
    if (ec) failed_ = true;
    return !failed_;
  }
  bool ClientGone() override { return failed_ || PeerClosed(fd_); }
  bool failed() const { return failed_; }

 private:
  tcp::socket& sock_;
  net::steady_timer& timer_;
  net::io_context& ioc_;
  int fd_;
  int timeout_;
  bool failed_ = false;
};

}  // namespace

void Server::Impl::Serve(Server* s, int fd, const std::string& peer, bool v6) {
  {
    net::io_context ioc;
    tcp::socket sock(ioc);
    beast::error_code ec;
    sock.assign(v6 ? tcp::v6() : tcp::v4(), fd, ec);
    if (!ec) Loop(s, sock, ioc, fd, peer);
    {
      std::lock_guard<std::mutex> l(s->mu_);
      s->fds_.erase(fd);  // before the descriptor is closed and its number reused
    }
    if (ec) {
      ::close(fd);
    } else {
      sock.shutdown(tcp::socket::shutdown_both, ec);
      sock.close(ec);
    }
  }
  std::lock_guard<std::mutex> l(s->mu_);
  --s->active_;
  if (--s->per_peer_[peer] == 0) s->per_peer_.erase(peer);
  s->cv_.notify_all();
}

void Server::Impl::Loop(Server* s, tcp::socket& sock, net::io_context& ioc, int fd,
                        const std::string& peer) {
  const Options& o = s->o_;
  beast::flat_buffer buf;
  net::steady_timer timer(ioc);
  // Answers an error the transport found in the request, and closes.
  std::string path;  // the request's, once its start line is read (the metrics' label)
  auto fail = [&](int status, const std::string& code, const std::string& msg, unsigned version) {
    Response res;
    s->FormatError(res, status, code, msg);
    bhttp::response<bhttp::string_body> r{static_cast<bhttp::status>(status), version};
    r.set(bhttp::field::server, "strata");
    r.set(bhttp::field::content_type, res.content_type);
    r.body() = res.body;
    r.keep_alive(false);
    r.prepare_payload();
    RunOp(ioc, sock, timer, In(o.write_timeout_s), [&](auto h) { bhttp::async_write(sock, r, h); });
    // A lingering close: the client may still be sending the body it announced; reading and
    // dropping it for a moment (2 s, 64 MiB at most) lets it read the answer instead of a reset.
    beast::error_code e;
    sock.shutdown(tcp::socket::shutdown_send, e);
    const Clock::time_point until = In(2);
    std::vector<char> scratch(64 << 10);
    for (int64_t dropped = 0; dropped < (int64_t{64} << 20) && Clock::now() < until;) {
      size_t got = 0;
      e = RunOp(ioc, sock, timer, until, [&](auto h) {
        sock.async_read_some(net::buffer(scratch), [&got, h](beast::error_code x, size_t k) {
          got = k;
          h(x, k);
        });
      });
      if (e) break;
      dropped += static_cast<int64_t>(got);
    }
    if (s->log_) {
      Request q;
      q.path = path;
      s->log_(q, res);
    }
  };
  for (int n = 0; n < o.max_requests_per_connection; ++n) {
    {
      std::lock_guard<std::mutex> l(s->mu_);
      if (s->stopping_) return;
      s->fds_[fd] = true;
    }
    // The first request's headers must arrive within the header deadline of the connection's
    // start; a later one's within the keep-alive limit (its first byte) and then the header
    // deadline.
    Clock::time_point header_deadline = In(o.header_timeout_s);
    if (buf.size() == 0) {
      const Clock::time_point wait = n == 0 ? header_deadline : In(o.keep_alive_s);
      beast::error_code ec = RunOp(ioc, sock, timer, wait, [&](auto h) {
        sock.async_read_some(buf.prepare(16 << 10), [&buf, h](beast::error_code e, size_t k) {
          buf.commit(k);
          h(e, k);
        });
      });
      if (ec) return;  // closed, idle past the limit, or stopping: nothing to answer
      if (n > 0) header_deadline = In(o.header_timeout_s);
    }
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(static_cast<uint32_t>(o.max_header_bytes));
    parser.body_limit(static_cast<uint64_t>(o.max_body_bytes));
    beast::error_code ec = RunOp(ioc, sock, timer, header_deadline, [&](auto h) {
      bhttp::async_read_header(sock, buf, parser, h);
    });
    auto refuse = [&](beast::error_code e, const char* part, int timeout_s) {
      const std::string target(parser.get().target());
      path = target.substr(0, target.find('?'));
      if (e == beast::error::timeout) {
        fail(408, "request_timeout",
             std::string("the request's ") + part + " did not arrive within " +
                 std::to_string(timeout_s) + " s",
             11);
      } else if (e == bhttp::error::body_limit) {
        fail(413, "request_too_large",
             "the request body is larger than the server's limit of " +
                 std::to_string(o.max_body_bytes) + " bytes",
             11);
      } else if (e == bhttp::error::header_limit) {
        fail(431, "headers_too_large",
             "the request's headers are larger than " + std::to_string(o.max_header_bytes) +
                 " bytes",
             11);
      } else if (e == bhttp::error::end_of_stream || e == net::error::eof ||
                 e == net::error::connection_reset || e == net::error::operation_aborted) {
        // the client went away (or the server is stopping): nobody to answer
      } else {
        fail(400, "bad_request", std::string("malformed HTTP request: ") + e.message(), 11);
      }
    };
    if (ec) return refuse(ec, "headers", o.header_timeout_s);
    {
      std::lock_guard<std::mutex> l(s->mu_);
      s->fds_[fd] = true;
    }
    const bool expect_continue =
        beast::iequals(parser.get()[bhttp::field::expect], "100-continue");
    if (!parser.is_done()) {
      if (expect_continue) {
        bhttp::response<bhttp::empty_body> cont{bhttp::status::continue_, parser.get().version()};
        if (RunOp(ioc, sock, timer, In(o.write_timeout_s),
                  [&](auto h) { bhttp::async_write(sock, cont, h); })) {
          return;
        }
      }
      ec = RunOp(ioc, sock, timer, In(o.body_timeout_s),
                 [&](auto h) { bhttp::async_read(sock, buf, parser, h); });
      if (ec) return refuse(ec, "body", o.body_timeout_s);
    }
    bhttp::request<bhttp::string_body> msg = parser.release();
    Request req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    req.path = req.target.substr(0, req.target.find('?'));
    for (const auto& f : msg) req.headers[Lower(std::string(f.name_string()))] = std::string(f.value());
    req.body = std::move(msg.body());
    req.peer = peer;
    {
      std::lock_guard<std::mutex> l(s->mu_);
      s->fds_[fd] = false;  // in a handler: Stop lets it finish
    }
    Response res;
    StreamConnection conn(fd);
    s->Dispatch(req, res, conn);
    const bool keep = msg.keep_alive() && !s->stopping_ && n + 1 < o.max_requests_per_connection;
    if (!res.stream) {
      bhttp::response<bhttp::string_body> r{static_cast<bhttp::status>(res.status), msg.version()};
      r.set(bhttp::field::server, "strata");
      r.set(bhttp::field::content_type, res.content_type);
      for (const auto& [k, v] : res.headers) r.set(k, v);
      r.body() = std::move(res.body);
      r.keep_alive(keep);
      r.prepare_payload();
      ec = RunOp(ioc, sock, timer, In(o.write_timeout_s),
                 [&](auto h) { bhttp::async_write(sock, r, h); });
      res.body = std::move(r.body());
      if (s->log_) s->log_(req, res);
      if (ec || !keep) return;
      continue;
    }
    bhttp::response<bhttp::empty_body> r{static_cast<bhttp::status>(res.status), msg.version()};
    r.set(bhttp::field::server, "strata");
    r.set(bhttp::field::content_type, res.content_type);
    for (const auto& [k, v] : res.headers) r.set(k, v);
    r.chunked(true);
    r.keep_alive(keep);
    bhttp::response_serializer<bhttp::empty_body> sr{r};
    ec = RunOp(ioc, sock, timer, In(o.write_timeout_s),
               [&](auto h) { bhttp::async_write_header(sock, sr, h); });
    ChunkSink sink(sock, timer, ioc, fd, o.write_timeout_s);
    if (!ec) res.stream(sink);
    if (ec || sink.failed()) {
      if (s->log_) s->log_(req, res);
      return;
    }
    ec = RunOp(ioc, sock, timer, In(o.write_timeout_s),
               [&](auto h) { net::async_write(sock, bhttp::make_chunk_last(), h); });
    if (s->log_) s->log_(req, res);
    if (ec || !keep) return;
  }
}

}  // namespace strata::serve::http
