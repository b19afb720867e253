// A service's plain JDK HTTP client with the local Envoy as its HTTP proxy, and no other
// change: the zero-code way onto the mesh for JDK clients (docs/eureka.md, "Moving a fleet").
// Run as a single source file: `java -Dhttp.proxyHost=127.0.0.1 -Dhttp.proxyPort=15001
// tests/jdk/ProxyGet.java <urlconnection|httpclient> http://<vip>/path`. Prints the status and
// the body on one line.
import java.net.HttpURLConnection;
import java.net.ProxySelector;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;

public class ProxyGet {
    public static void main(String[] args) throws Exception {
        URI uri = URI.create(args[1]);
        switch (args[0]) {
            case "urlconnection" -> {
                // HttpURLConnection takes the proxy from -Dhttp.proxyHost / -Dhttp.proxyPort.
                HttpURLConnection connection = (HttpURLConnection) uri.toURL().openConnection();
                int status = connection.getResponseCode();
                var body = status < 400 ? connection.getInputStream() : connection.getErrorStream();
                System.out.println(status + " " + new String(body.readAllBytes()).trim());
            }
            case "httpclient" -> {
                // java.net.http takes a proxy only when given one: the system's, from the same
                // properties.
                HttpClient client = HttpClient.newBuilder().proxy(ProxySelector.getDefault()).build();
                HttpResponse<String> response =
                        client.send(HttpRequest.newBuilder(uri).build(), HttpResponse.BodyHandlers.ofString());
                System.out.println(response.statusCode() + " " + response.body().trim());
            }
            default -> throw new IllegalArgumentException("urlconnection or httpclient, not " + args[0]);
        }
    }
}
