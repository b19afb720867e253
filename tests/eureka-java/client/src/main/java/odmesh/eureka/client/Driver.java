package odmesh.eureka.client;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.netflix.appinfo.ApplicationInfoManager;
import com.netflix.appinfo.InstanceInfo;
import com.netflix.appinfo.InstanceInfo.InstanceStatus;
import com.netflix.discovery.EurekaClient;
import com.netflix.discovery.shared.Application;
import com.netflix.discovery.shared.Applications;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.boot.context.event.ApplicationReadyEvent;
import org.springframework.boot.web.server.context.WebServerInitializedEvent;
import org.springframework.cloud.netflix.eureka.serviceregistry.EurekaRegistration;
import org.springframework.cloud.netflix.eureka.serviceregistry.EurekaServiceRegistry;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.context.event.EventListener;
import org.springframework.web.bind.annotation.RequestMapping;
import org.springframework.web.bind.annotation.RestController;

/**
 * A Spring Boot service on Spring Cloud Netflix's Eureka client, driven by odmesh's tests like
 * the js and py drivers (eureka/tests/clients/*&#47;register.*): it serves HTTP on a free
 * loopback port, answering {@code hello from <instance id>}, registers it with Eureka as any
 * Spring service does, heartbeats and fetches the registry. It reports on stdout as lines
 * starting with {@code odmesh-driver: } and obeys commands on stdin, one per line:
 *
 * <pre>
 *   out_of_service   an operator's override through Spring's EurekaServiceRegistry.setStatus:
 *                    PUT .../apps/APP/ID/status?value=OUT_OF_SERVICE
 *   in_service       setStatus(CANCEL_OVERRIDE): DELETE .../apps/APP/ID/status
 *   status S         the instance's own status (ApplicationInfoManager.setInstanceStatus):
 *                    it registers again with status S (POST .../apps/APP)
 *   metadata K=V     ApplicationInfoManager.registerAppMetadata: sent by the next periodic
 *                    registration (eureka.client.instance-info-replication-interval-seconds)
 *   fetch            reports what its local registry cache holds, as one JSON line
 *   fetches          reports how many full and delta fetches it made, and hash mismatches
 *   stop             closes the application: deregisters (DELETE .../apps/APP/ID), exits 0
 *   stop_within S    the same, but exits 0 after S seconds even if closing hangs
 * </pre>
 *
 * Reports: {@code listening <port>}, {@code ready}, then as they happen (Traffic):
 * {@code registered} (or {@code register failed <status>}), {@code heartbeat <status>},
 * {@code override <STATUS> <status>}, {@code override removed <status>},
 * {@code deregistered <status>}; and the answers to commands: {@code status S},
 * {@code metadata K=V}, {@code fetched {...}}, {@code fetches {...}}, {@code stopped},
 * {@code stop timed out}, {@code unknown command ...}. When stdin closes (the test is gone)
 * it stops as on {@code stop}.
 */
@SpringBootApplication
@RestController
public class Driver {

    private static final ObjectMapper JSON = new ObjectMapper();

    private final ConfigurableApplicationContext context;
    private final EurekaServiceRegistry serviceRegistry;
    private final EurekaRegistration registration;
    private final ApplicationInfoManager infoManager;
    private final EurekaClient eurekaClient;

    Driver(ConfigurableApplicationContext context, EurekaServiceRegistry serviceRegistry,
            EurekaRegistration registration, ApplicationInfoManager infoManager,
            EurekaClient eurekaClient) {
        this.context = context;
        this.serviceRegistry = serviceRegistry;
        this.registration = registration;
        this.infoManager = infoManager;
        this.eurekaClient = eurekaClient;
    }

    public static void main(String[] args) {
        Traffic.countHashMismatches();
        SpringApplication.run(Driver.class, args);
    }

    static void say(String line) {
        System.out.println("odmesh-driver: " + line);
    }

    @RequestMapping("/**")
    String hello() {
        return "hello from " + infoManager.getInfo().getId() + "\n";
    }

    @EventListener
    void listening(WebServerInitializedEvent event) {
        say("listening " + event.getWebServer().getPort());
    }

    @EventListener
    void ready(ApplicationReadyEvent event) {
        // Not a daemon: "stop" closes the application from this thread, and the JVM must not
        // end (its last other thread gone) before the thread reports "stopped" and exits.
        Thread commands = new Thread(this::obeyStdin, "odmesh-driver-stdin");
        commands.start();
        say("ready");
    }

    private void obeyStdin() {
        BufferedReader stdin = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try {
            String line;
            while ((line = stdin.readLine()) != null) {
                obey(line.trim());
            }
        } catch (IOException e) {
            say("stdin failed: " + e);
        }
        stop(null);
    }

    private void obey(String line) {
        String[] words = line.split("\\s+", 2);
        String arg = words.length > 1 ? words[1].trim() : "";
        try {
            switch (words[0]) {
                case "out_of_service" -> serviceRegistry.setStatus(registration, "OUT_OF_SERVICE");
                case "in_service" -> serviceRegistry.setStatus(registration, "CANCEL_OVERRIDE");
                case "status" -> {
                    InstanceStatus status = InstanceStatus.toEnum(arg);
                    if (!status.name().equals(arg)) {
                        say("unknown command " + line);
                        return;
                    }
                    infoManager.setInstanceStatus(status);
                    say("status " + status);
                }
                case "metadata" -> {
                    int eq = arg.indexOf('=');
                    if (eq <= 0) {
                        say("unknown command " + line);
                        return;
                    }
                    infoManager.registerAppMetadata(Map.of(arg.substring(0, eq), arg.substring(eq + 1)));
                    say("metadata " + arg);
                }
                case "fetch" -> say("fetched " + JSON.writeValueAsString(cache(eurekaClient.getApplications())));
                case "fetches" -> say("fetches " + JSON.writeValueAsString(Traffic.fetches()));
                case "stop" -> stop(null);
                case "stop_within" -> stop(Double.parseDouble(arg));
                default -> say("unknown command " + line);
            }
        } catch (JsonProcessingException | RuntimeException e) {
            say("command failed: " + line + ": " + e);
        }
    }

    /** Closes the application, which deregisters; after {@code within} seconds, exits anyway. */
    private void stop(Double within) {
        if (within != null) {
            Thread deadline = new Thread(() -> {
                try {
                    Thread.sleep((long) (within * 1000));
                } catch (InterruptedException e) {
                    return;
                }
                say("stop timed out: exiting without deregistering");
                Runtime.getRuntime().halt(0);
            }, "odmesh-driver-stop-deadline");
            deadline.setDaemon(true);
            deadline.start();
        }
        SpringApplication.exit(context);
        say("stopped");
        System.exit(0);
    }

    /** Every instance the client's cache holds (not only the UP ones its callers get). */
    private static Map<String, Object> cache(Applications applications) {
        List<String> apps = new ArrayList<>();
        List<Map<String, Object>> instances = new ArrayList<>();
        for (Application app : applications.getRegisteredApplications()) {
            apps.add(app.getName());
            for (InstanceInfo i : app.getInstancesAsIsFromEureka()) {
                Map<String, Object> instance = new LinkedHashMap<>();
                instance.put("id", i.getId());
                instance.put("app", i.getAppName());
                instance.put("status", i.getStatus().name());
                instance.put("overriddenStatus", i.getOverriddenStatus().name());
                instance.put("ip", i.getIPAddr());
                instance.put("port", i.getPort());
                instance.put("vip", i.getVIPAddress());
                instance.put("metadata", new TreeMap<>(i.getMetadata()));
                instances.add(instance);
            }
        }
        apps.sort(Comparator.naturalOrder());
        instances.sort(Comparator.comparing(i -> (String) i.get("id")));
        Map<String, Object> cache = new LinkedHashMap<>();
        cache.put("apps", apps);
        cache.put("instances", instances);
        cache.put("hash", applications.getAppsHashCode());
        return cache;
    }
}
