// Test support: a throwaway PKI made with the openssl command line (Debian's openssl package), for
// etcd over TLS: a CA, a server certificate it signed for 127.0.0.1 (and no host name), a client
// certificate it signed, and a client certificate of an unrelated CA. The client certificates
// name no CN (etcd 3.4's gateway refuses one with a CN while etcd's user authentication is on).
// Keys are P-256, valid for two days; everything lives in the test's own directory.
#pragma once

#include <cstdlib>
#include <fstream>
#include <string>

namespace kvagent::testing {

inline constexpr const char* kOpensslBinary = "/usr/bin/openssl";

struct TestPki {
  std::string ca;  // the CA certificate (PEM)
  std::string server_cert, server_key;
  std::string client_cert, client_key;  // signed by `ca`
  std::string rogue_cert, rogue_key;    // signed by another CA
};

// Makes the PKI under `dir`; false when openssl failed (its output is in dir/openssl.log).
inline bool MakeTestPki(const std::string& dir, TestPki* out) {
  const std::string d = dir + "/pki";
  const std::string log = dir + "/openssl.log";
  std::ofstream(dir + "/server.ext") << "basicConstraints=CA:FALSE\n"
                                        "subjectAltName=IP:127.0.0.1\n"
                                        // etcd's JSON gateway dials etcd itself with the
                                        // server's certificate as its client certificate
                                        "extendedKeyUsage=serverAuth,clientAuth\n";
  std::ofstream(dir + "/client.ext") << "basicConstraints=CA:FALSE\n"
                                        "extendedKeyUsage=clientAuth\n";
  const std::string o = std::string(kOpensslBinary);
  const std::string key = " -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
  auto ca = [&](const std::string& name) {
    return o + " req -x509" + key + " -keyout " + d + "/" + name + ".key -out " + d + "/" + name +
           ".pem -days 2 -subj /CN=kvagent-test-" + name +
           " -addext basicConstraints=critical,CA:TRUE -addext keyUsage=keyCertSign,cRLSign";
  };
  auto leaf = [&](const std::string& name, const std::string& by, const std::string& ext) {
    const std::string subject =
        name == "server" ? "/CN=kvagent-test-server" : "/O=kvagent-test/OU=" + name;
    return o + " req" + key + " -keyout " + d + "/" + name + ".key -out " + d + "/" + name +
           ".csr -subj " + subject + " && " + o + " x509 -req -in " + d + "/" + name + ".csr -CA " +
           d + "/" + by + ".pem -CAkey " + d + "/" + by + ".key -CAcreateserial -days 2 -extfile " +
           dir + "/" + ext + " -out " + d + "/" + name + ".pem";
  };
  const std::string script = "mkdir -p " + d + " && " + ca("ca") + " && " + ca("rogue-ca") +
                             " && " + leaf("server", "ca", "server.ext") + " && " +
                             leaf("client", "ca", "client.ext") + " && " +
                             leaf("rogue", "rogue-ca", "client.ext");
  if (std::system(("(" + script + ") >" + log + " 2>&1").c_str()) != 0) return false;
  *out = TestPki{d + "/ca.pem",     d + "/server.pem", d + "/server.key", d + "/client.pem",
                 d + "/client.key", d + "/rogue.pem",  d + "/rogue.key"};
  return true;
}

}  // namespace kvagent::testing
