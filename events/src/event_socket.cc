#include "event_socket.h"

#include <atomic>
#include <cerrno>

namespace kvagent::events {
namespace {

std::string Advice(int err, const std::string& endpoint) {
  switch (err) {
    case EADDRINUSE:
      return "; another process holds this address: stop it or choose another port/path";
    case ENOENT:
      return "; the directory of this ipc path does not exist: create it first";
    case EACCES:
      return "; permission denied: check the ipc directory's owner and mode";
    case EPROTONOSUPPORT:
      return "; use tcp://, ipc:// or inproc://";
    case EINVAL:
      return "; expected e.g. tcp://127.0.0.1:5557, tcp://*:0 or ipc:///run/kvagent/events.sock";
    case EADDRNOTAVAIL:
    case ENODEV:
      return "; no local interface has this address: use * or a local IP";
    default:
      return endpoint.empty() ? "; the endpoint is empty" : "";
  }
}

}  // namespace

Status BindEventSocket(zmq::socket_t& socket, const std::string& endpoint, std::string_view role) {
  try {
    socket.bind(endpoint);
    return Status::Ok();
  } catch (const zmq::error_t& e) {
    return InvalidParams("cannot bind the " + std::string(role) + " socket to \"" + endpoint +
                         "\": " + e.what() + Advice(e.num(), endpoint));
  }
}

Status ConnectEventSocket(zmq::socket_t& socket, const std::string& endpoint,
                          std::string_view role) {
  try {
    socket.connect(endpoint);
    return Status::Ok();
  } catch (const zmq::error_t& e) {
    return InvalidParams("cannot connect the " + std::string(role) + " socket to \"" + endpoint +
                         "\": " + e.what() + Advice(e.num(), endpoint));
  }
}

bool ReceiveMultipart(zmq::socket_t& socket, size_t max_parts, std::vector<zmq::message_t>* parts,
                      bool* too_many) {
  parts->clear();
  *too_many = false;
  zmq::message_t frame;
  try {
    if (!socket.recv(frame, zmq::recv_flags::dontwait)) return false;
    while (true) {
      const bool more = frame.more();
      if (parts->size() < max_parts) {
        parts->push_back(std::move(frame));
        frame = zmq::message_t();
      } else {
        *too_many = true;
      }
      if (!more) return true;
      // The rest of a multipart message is already here: ZMQ delivers messages atomically.
      if (!socket.recv(frame, zmq::recv_flags::none)) return false;
    }
  } catch (const zmq::error_t&) {
    return false;  // ETERM while shutting down
  }
}

namespace {

// Frees the reference a zero-copy message held (called by ZMQ, possibly on its I/O thread).
void ReleaseShared(void*, void* hint) {
  delete static_cast<std::shared_ptr<const std::string>*>(hint);
}

}  // namespace

bool SendSharedFrame(zmq::socket_t& socket, const std::shared_ptr<const std::string>& payload) {
  zmq_msg_t msg;
  if (payload == nullptr || payload->empty()) {
    zmq_msg_init(&msg);
  } else {
    auto* hint = new std::shared_ptr<const std::string>(payload);
    if (zmq_msg_init_data(&msg, const_cast<char*>(payload->data()), payload->size(), ReleaseShared,
                          hint) != 0) {
      delete hint;
      return false;
    }
  }
  if (zmq_msg_send(&msg, socket.handle(), ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&msg);  // releases the reference
    return false;
  }
  return true;
}

void TakeSentBuffer(const std::shared_ptr<std::string>& sent, std::string* into) {
  if (sent.use_count() != 1 || into->capacity() >= sent->capacity()) return;
  // Pairs with the release of the last other reference (ZMQ's, on its I/O thread): its reads of
  // the bytes happen before our writes.
  std::atomic_thread_fence(std::memory_order_acquire);
  into->swap(*sent);
  into->clear();
}

bool SendFrame(zmq::socket_t& socket, std::string_view frame, bool more) {
  try {
    auto flags = zmq::send_flags::dontwait;
    if (more) flags = flags | zmq::send_flags::sndmore;
    return socket.send(zmq::const_buffer(frame.data(), frame.size()), flags).has_value();
  } catch (const zmq::error_t&) {
    return false;  // EHOSTUNREACH (mandatory routing) or ETERM
  }
}

}  // namespace kvagent::events
