#!/usr/bin/env bash
# Spark 4 needs Java 17 or newer on PATH (or JAVA_HOME). Exit 1 with install hints when missing.
set -u
java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
if ! version_line=$("$java_bin" -version 2>&1 | head -n 1) || [ -z "$version_line" ]; then
  echo "sparkdl needs Java 17 (Spark 4 runs on Java 17 or 21), and no 'java' was found." >&2
  echo "Install it: Debian/Ubuntu 'sudo apt-get install -y openjdk-17-jre-headless'; macOS 'brew install openjdk@17';" >&2
  echo "or point JAVA_HOME at a Java 17 installation." >&2
  exit 1
fi
major=$(printf '%s\n' "$version_line" | sed -E 's/.*version "([0-9]+)(\.[0-9]+)?.*/\1/')
if [ "$major" = "1" ] || ! [ "$major" -ge 17 ] 2>/dev/null; then
  echo "sparkdl needs Java 17 or newer; found: $version_line" >&2
  echo "Install it: Debian/Ubuntu 'sudo apt-get install -y openjdk-17-jre-headless'; macOS 'brew install openjdk@17'." >&2
  exit 1
fi
