package odmesh.eureka.client;

import java.io.IOException;
import java.net.URI;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;

import com.netflix.spectator.api.Counter;
import com.netflix.spectator.api.DefaultRegistry;
import com.netflix.spectator.api.Registry;
import com.netflix.spectator.api.Spectator;

import jakarta.ws.rs.client.ClientRequestContext;
import jakarta.ws.rs.client.ClientRequestFilter;
import jakarta.ws.rs.client.ClientResponseContext;
import jakarta.ws.rs.client.ClientResponseFilter;

import org.springframework.http.HttpRequest;
import org.springframework.http.client.ClientHttpRequestExecution;
import org.springframework.http.client.ClientHttpRequestInterceptor;
import org.springframework.http.client.ClientHttpResponse;

/**
 * What the Eureka client sends and what it is answered, seen on its own HTTP client: a
 * RestClient interceptor ({@link RestClientTap}) or a Jersey filter ({@link JerseyTap}), both
 * given to the client by {@link Transports}. Fetches are counted here from the requests
 * ({@code GET .../apps/} is a full fetch, {@code GET .../apps/delta} a delta), answered 200;
 * writes are reported as they are answered.
 *
 * <p>Hash mismatches are not visible on the wire (the full fetch that follows one looks like
 * any other): they are read from the counter Eureka's DiscoveryClient increments for each,
 * {@code DiscoveryClient_ReconcileHashCodeMismatch}, in Spectator's global registry.
 */
final class Traffic {

    private static final AtomicLong FULL = new AtomicLong();
    private static final AtomicLong DELTA = new AtomicLong();
    private static final AtomicLong FAILED = new AtomicLong();
    private static final Registry METERS = new DefaultRegistry();

    private Traffic() {
    }

    /** Adds a registry to Spectator's global one before Eureka creates its counters. */
    static void countHashMismatches() {
        Spectator.globalRegistry().add(METERS);
    }

    static Map<String, Long> fetches() {
        long mismatches = METERS.counters()
            .filter(c -> c.id().name().equals("DiscoveryClient_ReconcileHashCodeMismatch"))
            .mapToLong(Counter::count)
            .sum();
        Map<String, Long> fetches = new LinkedHashMap<>();
        fetches.put("full", FULL.get());
        fetches.put("delta", DELTA.get());
        fetches.put("mismatch", mismatches);
        fetches.put("failed", FAILED.get());
        return fetches;
    }

    /** One exchange of the Eureka client: {@code status} is -1 when no answer came. */
    static void record(String method, URI uri, int status) {
        String path = uri.getPath();
        int apps = path.indexOf("/apps");
        if (apps < 0) {
            return;
        }
        // "" or "/" (the registry), "/delta", "/APP", "/APP/ID", "/APP/ID/status".
        String[] parts = path.substring(apps + "/apps".length()).split("/");
        int depth = parts.length == 0 ? 0 : parts.length - 1;
        boolean ok = status >= 200 && status < 300;
        switch (method) {
            case "GET" -> {
                if (depth == 0 || (depth == 1 && parts[1].equals("delta"))) {
                    (!ok ? FAILED : depth == 0 ? FULL : DELTA).incrementAndGet();
                }
            }
            case "POST" -> Driver.say(status == 204 ? "registered" : "register failed " + status);
            case "PUT" -> {
                if (depth == 2) {
                    Driver.say("heartbeat " + status);
                } else if (depth == 3) {
                    Driver.say("override " + query(uri, "value") + " " + status);
                }
            }
            case "DELETE" -> Driver.say(depth == 3 ? "override removed " + status : "deregistered " + status);
            default -> {
            }
        }
    }

    private static String query(URI uri, String name) {
        String query = uri.getQuery() == null ? "" : uri.getQuery();
        for (String pair : query.split("&")) {
            if (pair.startsWith(name + "=")) {
                return pair.substring(name.length() + 1);
            }
        }
        return "";
    }

    /** The RestClient transport's tap. */
    static final class RestClientTap implements ClientHttpRequestInterceptor {
        @Override
        public ClientHttpResponse intercept(HttpRequest request, byte[] body, ClientHttpRequestExecution execution)
                throws IOException {
            try {
                ClientHttpResponse response = execution.execute(request, body);
                record(request.getMethod().name(), request.getURI(), response.getStatusCode().value());
                return response;
            } catch (IOException | RuntimeException e) {
                record(request.getMethod().name(), request.getURI(), -1);
                throw e;
            }
        }
    }

    /**
     * The Jersey 3 transport's tap. Eureka takes additional filters as request filters; JAX-RS
     * registers an object for every filter interface it implements, so this one also sees the
     * response.
     */
    static final class JerseyTap implements ClientRequestFilter, ClientResponseFilter {
        @Override
        public void filter(ClientRequestContext request) {
        }

        @Override
        public void filter(ClientRequestContext request, ClientResponseContext response) {
            record(request.getMethod(), request.getUri(), response.getStatus());
        }
    }
}
