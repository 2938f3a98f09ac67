using System.Diagnostics;
using System.Net;
using System.Net.Security;
using System.Net.Sockets;
using System.Runtime.CompilerServices;
using Microsoft.AspNetCore.Hosting;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Reliability.Tests.BadInput;

/// <summary>TLS that never finishes, and TLS sent where plain HTTP is expected.</summary>
public sealed class TlsBadInputTests(ITestOutputHelper output)
{
    private static readonly TimeSpan s_handshakeTimeout = TimeSpan.FromSeconds(2);

    public static TheoryData<TransportKind> Kinds =>
        new() { TransportKind.Sockets, TransportKind.LinuxNative, TransportKind.LinuxInline, TransportKind.LinuxManaged, TransportKind.LinuxIoUring };

    /// <summary>
    /// Four clients send the first half of a real ClientHello and then nothing. Meanwhile other TLS clients on the
    /// same loop (ThreadCount = 1) complete their handshakes and requests. The server closes each half handshake
    /// by itself once HandshakeTimeout (2 s) has passed — not before, and not never.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task A_half_ClientHello_then_silence_is_closed_by_the_handshake_timeout_while_other_TLS_clients_are_served(TransportKind kind)
    {
        using var certificate = TestCertificate.Create();
        await using var host = await TestHost.StartAsync(kind, output, context => context.Response.WriteAsync("secure"), s =>
        {
            s.Linux = o => o.ThreadCount = 1;
            s.Listen = listen => listen.UseHttps(https =>
            {
                https.ServerCertificate = certificate;
                https.HandshakeTimeout = s_handshakeTimeout;
            });
        });

        var clientHello = await CaptureClientHelloAsync();
        var stopwatch = Stopwatch.StartNew();
        var stalled = new List<Socket>();
        for (var i = 0; i < 4; i++)
        {
            var socket = await TestSockets.ConnectAsync(host.EndPoint);
            await socket.SendAllAsync(clientHello.AsMemory(0, clientHello.Length / 2));
            stalled.Add(socket);
        }

        var closes = stalled.Select(async socket =>
        {
            var end = await ReadUntilClosedAsync(socket, TestTimeouts.Default);
            return (end, stopwatch.Elapsed);
        }).ToList();

        var validations = new StrongBox<int>();
        using (var client = new HttpClient(TestCertificate.CreateHandlerTrusting(certificate, validations)) { Timeout = TestTimeouts.Default })
        {
            for (var i = 0; i < 5; i++)
            {
                using var request = new HttpRequestMessage(HttpMethod.Get, new Uri(host.Address, $"/served/{i}"));
                request.Headers.ConnectionClose = true; // a new handshake for every request
                using var response = await client.SendAsync(request);
                Assert.Equal(HttpStatusCode.OK, response.StatusCode);
                Assert.Equal("secure", await response.Content.ReadAsStringAsync());
            }
        }

        var servedAt = stopwatch.Elapsed;
        Assert.True(validations.Value >= 5, "The TLS clients never validated the server certificate.");
        foreach (var (end, elapsed) in await Task.WhenAll(closes))
        {
            output.WriteLine($"{kind}: half handshake ended by {end} after {elapsed.TotalSeconds:F2} s (served clients done at {servedAt.TotalSeconds:F2} s).");
            Assert.NotEqual(ConnectionEnd.Timeout, end);
            Assert.True(elapsed >= s_handshakeTimeout - TimeSpan.FromMilliseconds(100), $"The half handshake was closed after {elapsed.TotalSeconds:F2} s, before the {s_handshakeTimeout.TotalSeconds} s handshake timeout.");
            Assert.True(elapsed < s_handshakeTimeout + TimeSpan.FromSeconds(8), $"The half handshake was closed only after {elapsed.TotalSeconds:F2} s.");
        }

        stalled.ForEach(s => s.Dispose());
        await host.StopAsync();
    }

    /// <summary>
    /// A complete, real ClientHello sent to a plain HTTP endpoint (no client FIN) gets a 400 and a close, or a close,
    /// as Kestrel decides; the same loop (ThreadCount = 1) then still serves a healthy keep-alive connection.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task A_ClientHello_on_a_plain_HTTP_port_gets_400_or_a_close_and_the_loop_keeps_serving(TransportKind kind)
    {
        await using var host = await TestHost.StartAsync(kind, output, context => context.Response.WriteAsync("plain"), s => s.Linux = o => o.ThreadCount = 1);
        using var healthy = new RawHttpConnection(await TestSockets.ConnectAsync(host.EndPoint));
        var clientHello = await CaptureClientHelloAsync();

        for (var i = 0; i < 3; i++)
        {
            var outcome = await RawExchange.RunAsync(host.EndPoint, [clientHello], 0, TimeSpan.FromSeconds(10));
            output.WriteLine($"{kind}: ClientHello on plain HTTP -> '{outcome.Class}' ({outcome.End}) in {outcome.Elapsed.TotalMilliseconds:F0} ms");
            Assert.True(outcome.Class is "400 close" or "no-response close", $"{kind}: a ClientHello on a plain port ended as '{outcome.Class}' ({outcome.End}) {outcome.Malformed}");

            await healthy.SendAsync(RawHttpRequest.Get("/after-tls"), TestTimeouts.Default);
            var response = await healthy.ReadResponseAsync(TestTimeouts.Default);
            Assert.Equal(200, response.StatusCode);
            Assert.Equal("plain", response.BodyText);
        }

        await host.StopAsync();
    }

    /// <summary>The first TLS record a real SslStream client sends (its ClientHello), read off a loopback socket.</summary>
    private static async Task<byte[]> CaptureClientHelloAsync()
    {
        using var listener = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        listener.Bind(new IPEndPoint(IPAddress.Loopback, 0));
        listener.Listen();
        using var client = await TestSockets.ConnectAsync(listener.LocalEndPoint!);
        using var server = await listener.AcceptAsync().WaitAsync(TestTimeouts.Default);
        using var ssl = new SslStream(new NetworkStream(client, ownsSocket: false));
        var handshake = ssl.AuthenticateAsClientAsync(new SslClientAuthenticationOptions
        {
            TargetHost = "localhost",
            RemoteCertificateValidationCallback = (_, _, _, _) => false,
        });

        var header = new byte[5];
        await server.ReceiveExactlyAsync(header);
        Assert.Equal(0x16, header[0]); // handshake record
        var body = new byte[(header[3] << 8) | header[4]];
        await server.ReceiveExactlyAsync(body);
        Assert.Equal(0x01, body[0]); // ClientHello

        server.Close();
        await Assert.ThrowsAnyAsync<Exception>(() => handshake).WaitAsync(TestTimeouts.Default);
        return [.. header, .. body];
    }

    private static async Task<ConnectionEnd> ReadUntilClosedAsync(Socket socket, TimeSpan timeout)
    {
        using var cts = new CancellationTokenSource(timeout);
        var buffer = new byte[4096];
        try
        {
            while (await socket.ReceiveAsync(buffer, SocketFlags.None, cts.Token) > 0)
            {
            }

            return ConnectionEnd.Fin;
        }
        catch (SocketException ex) when (ex.SocketErrorCode == SocketError.ConnectionReset)
        {
            return ConnectionEnd.Reset;
        }
        catch (OperationCanceledException) when (cts.IsCancellationRequested)
        {
            return ConnectionEnd.Timeout;
        }
    }
}
