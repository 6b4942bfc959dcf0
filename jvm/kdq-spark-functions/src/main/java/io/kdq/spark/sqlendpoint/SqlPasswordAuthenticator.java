package io.kdq.spark.sqlendpoint;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.Map;
import javax.security.sasl.AuthenticationException;
import org.apache.hive.service.auth.PasswdAuthenticationProvider;

/**
 * User and password check of the SQL endpoint's Thrift server (HiveServer2 {@code CUSTOM}
 * authentication), for deployments where the endpoint is reachable by more than its own machine.
 *
 * <p>The expected credentials come from the endpoint process's environment: {@code KDQ_SQL_PASSWORD}
 * (required: without it every login is refused, so a missing secret never opens the endpoint) and
 * {@code KDQ_SQL_USER} (default {@code kdq}). Both are compared in constant time. Enabled by
 * {@code hive.server2.authentication=CUSTOM} and {@code
 * hive.server2.custom.authentication.class=io.kdq.spark.sqlendpoint.SqlPasswordAuthenticator}, which kdq sets
 * when {@code KDQ_SQL_PASSWORD} is set.
 */
public final class SqlPasswordAuthenticator implements PasswdAuthenticationProvider {
  static final String PASSWORD_ENV = "KDQ_SQL_PASSWORD";
  static final String USER_ENV = "KDQ_SQL_USER";
  static final String DEFAULT_USER = "kdq";

  private final Map<String, String> env;

  public SqlPasswordAuthenticator() {
    this(System.getenv());
  }

  SqlPasswordAuthenticator(Map<String, String> env) {
    this.env = env;
  }

  @Override
  public void Authenticate(String user, String password) throws AuthenticationException {
    String expectedPassword = env.get(PASSWORD_ENV);
    if (expectedPassword == null || expectedPassword.isEmpty()) {
      throw new AuthenticationException(PASSWORD_ENV + " is not set in the SQL endpoint: every login is refused");
    }
    String expectedUser = env.getOrDefault(USER_ENV, DEFAULT_USER);
    // Both comparisons always run: the time taken says nothing about which part was wrong.
    boolean userOk = same(expectedUser, user);
    boolean passwordOk = same(expectedPassword, password);
    if (!(userOk & passwordOk)) {
      throw new AuthenticationException("wrong user or password");
    }
  }

  private static boolean same(String expected, String given) {
    byte[] a = expected.getBytes(StandardCharsets.UTF_8);
    byte[] b = (given == null ? "" : given).getBytes(StandardCharsets.UTF_8);
    return MessageDigest.isEqual(a, b);
  }
}
