#!/usr/bin/env bash
# Runs the consumer once per protobuf-java version given (make test-java: the 3.25.x the client is compiled against,
# the oldest and the newest 4.x), each time pinning that line through protobuf-bom, with the ragsidecar artifacts
# taken from dist/maven (`make dist-java` builds it). The local repository's copies of them are purged first: there
# they are release versions, which Maven would never fetch again, so a rebuilt dist/ would go untested.
# Usage: run.sh PROTOBUF_VERSION...
set -euo pipefail
cd "$(dirname "$0")"
test -d ../../../dist/maven/io/ragsidecar || { echo "dist/maven is missing: run make dist-java first" >&2; exit 1; }
mvn -q -B org.apache.maven.plugins:maven-dependency-plugin:3.8.1:purge-local-repository -DreResolve=false \
  -DmanualInclude=io.ragsidecar:ragsidecar-client,io.ragsidecar:ragsidecar-langchain4j,io.ragsidecar:ragsidecar-spring-ai
for version in "$@"; do
  echo "maven-consumer on protobuf-java $version"
  mvn -q -B test -Dprotobuf.version="$version"
done
